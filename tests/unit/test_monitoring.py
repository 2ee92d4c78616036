"""The shipped alert rules and dashboard (deploy/monitoring/) are valid for Prometheus (``promtool``, from
Debian's ``prometheus`` package, which deploy/setup.sh installs), and the alerts fire when they should and
only then (``promtool test rules`` on made-up series)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.monitoring import RULES, dashboard_queries, metric_names, promtool, rule_queries


@pytest.fixture(scope="module")
def promtool_path() -> str:
    path = promtool()
    if path is None:
        message = "promtool is not installed (Debian: apt-get install prometheus; deploy/setup.sh does)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    return path


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, timeout=60)


def test_the_alert_rules_pass_promtool_check_rules(promtool_path: str) -> None:
    result = run(promtool_path, "check", "rules", str(RULES))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(rule_queries())} rules found" in result.stdout


def test_every_dashboard_query_is_valid_promql(promtool_path: str, tmp_path: Path) -> None:
    """Each query of the dashboard, as a recording rule, through the same parser."""
    queries = dashboard_queries()
    rules = {"groups": [{"name": "dashboard", "rules": [{"record": f"dashboard:q{i}", "expr": q}
                                                         for i, q in enumerate(queries)]}]}  # fmt: skip
    path = tmp_path / "dashboard-queries.yml"
    path.write_text(yaml.safe_dump(rules))
    result = run(promtool_path, "check", "rules", str(path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(queries)} rules found" in result.stdout


def test_the_dashboard_shows_what_an_operator_asks_for() -> None:
    """Copy lag, upload and fetch rates, the remote hit ratio, errors, retries and the store's availability."""
    used = metric_names(dashboard_queries())
    assert used >= {
        "tiering_remote_copy_lag_bytes", "tiering_remote_copy_bytes_total", "tiering_remote_fetch_bytes_total",
        "tiering_proxy_fetch_partitions_total", "tiering_remote_copy_errors_total", "tiering_remote_fetch_errors_total",
        "tiering_proxy_remote_errors_total", "tiering_task_errors_total", "tiering_reader_store_retries_total",
        "tiering_remote_store_unavailable", "tiering_reader_store_unavailable", "tiering_metadata_wal_lag_records",
    }  # fmt: skip


# (alert, input series as promtool's expanding notation, evaluated at, the labels of the alerts expected then)
CASES = [
    ("TieringRemoteStoreUnavailable", {'tiering_remote_store_unavailable{job="sidecar",instance="b1"}': "0 1x30"},
     "4m", []),
    ("TieringRemoteStoreUnavailable", {'tiering_remote_store_unavailable{job="sidecar",instance="b1"}': "0 1x30"},
     "10m", [{"job": "sidecar", "instance": "b1"}]),
    ("TieringRemoteStoreUnavailable",  # an outage of a minute at a time is not one
     {'tiering_reader_store_unavailable{job="proxy",instance="p1"}': "1 0 1 0 1 0 1 0"}, "7m", []),
    ("TieringRemoteStoreUnavailable", {'tiering_reader_store_unavailable{job="proxy",instance="p1"}': "1x30"},
     "10m", [{"job": "proxy", "instance": "p1"}]),
    ("TieringPartitionStuckInError",
     {'tiering_task_consecutive_failures{instance="b1",topic="orders",partition="3",operation="copy"}': "1+1x40"},
     "30m", [{"instance": "b1", "topic": "orders", "partition": "3", "operation": "copy"}]),
    ("TieringPartitionStuckInError",  # fails a few times, then succeeds: the series ends
     {'tiering_task_consecutive_failures{instance="b1",topic="orders",partition="3",operation="copy"}': "1 2 3 4"},
     "30m", []),
    ("TieringSidecarOperationFailing",
     {'tiering_task_consecutive_failures{instance="b1",topic="",partition="",operation="tick"}': "1+1x40"},
     "30m", [{"instance": "b1", "operation": "tick"}]),  # an empty label is no label
    ("TieringMetadataWalLag",
     {'tiering_metadata_wal_lag_records{job="sidecar",instance="b1",wal_partition="7"}': "5000x30"},
     "20m", [{"job": "sidecar", "instance": "b1"}]),
    ("TieringMetadataWalLag",
     {'tiering_metadata_wal_lag_records{job="sidecar",instance="b1",wal_partition="7"}': "20x30"}, "20m", []),
    ("TieringCopyLagGrowing",
     {'tiering_remote_copy_lag_bytes{instance="b1",topic="orders",partition="0"}': "0+1000000x120",
      'tiering_remote_copy_lag_segments{instance="b1",topic="orders",partition="0"}': "1+1x120"},
     "90m", [{"instance": "b1", "topic": "orders", "partition": "0"}]),
    ("TieringCopyLagGrowing",  # a segment rolls and is copied: the lag goes up and down, it does not grow
     {'tiering_remote_copy_lag_bytes{instance="b1",topic="orders",partition="0"}': "0 1000000 " * 60,
      'tiering_remote_copy_lag_segments{instance="b1",topic="orders",partition="0"}': "0 1 " * 60},
     "90m", []),
    ("TieringRemoteFetchErrors", {'tiering_proxy_remote_errors_total{job="proxy",instance="p1"}': "0+5x60"},
     "30m", [{"job": "proxy", "instance": "p1"}]),
]  # fmt: skip


def test_the_alerts_fire_when_they_should_and_only_then(promtool_path: str, tmp_path: Path) -> None:
    """``promtool test rules`` on the shipped rules without their annotations (the test compares labels)."""
    doc = yaml.safe_load(RULES.read_text())
    severity = {}
    for group in doc["groups"]:
        for rule in group["rules"]:
            rule.pop("annotations", None)
            severity[rule["alert"]] = rule["labels"]["severity"]
    rules = tmp_path / "rules.yml"
    rules.write_text(yaml.safe_dump(doc))
    tests = [
        {
            "interval": "1m",
            "input_series": [{"series": series, "values": values.strip()} for series, values in inputs.items()],
            "alert_rule_test": [{
                "eval_time": at, "alertname": alert,
                "exp_alerts": [{"exp_labels": {**labels, "severity": severity[alert]}} for labels in expected],
            }],
        }
        for alert, inputs, at, expected in CASES
    ]  # fmt: skip
    assert {case[0] for case in CASES} == set(severity), "an alert without a test"
    spec = tmp_path / "rules_test.yml"
    spec.write_text(yaml.safe_dump({"rule_files": [str(rules)], "evaluation_interval": "1m", "tests": tests}))
    result = run(promtool_path, "test", "rules", str(spec))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout
