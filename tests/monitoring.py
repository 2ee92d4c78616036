"""The shipped Grafana dashboard and Prometheus rules (deploy/monitoring/), read for the tests: their PromQL
expressions and the metric names these use."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import yaml

MONITORING = Path(__file__).parents[1] / "deploy" / "monitoring"
DASHBOARD = MONITORING / "grafana-dashboard.json"
RULES = MONITORING / "prometheus-rules.yml"

# Every metric the project exports starts so (tiering/metrics.py, reader/http/metrics.py, reader/proxy/metrics.py);
# no label of theirs does.
_METRIC = re.compile(r"\btiering_[a-z0-9_]+\b")
# Grafana's variables, replaced by what they stand for when Grafana sends the query.
_VARIABLES = {"$__rate_interval": "5m", "$topic": ".*"}


def dashboard_queries() -> list[str]:
    """Every PromQL expression of the dashboard: its panels' targets and its variables' queries."""
    doc = json.loads(DASHBOARD.read_text())
    queries = [t["expr"] for p in doc["panels"] for t in p.get("targets", [])]
    for variable in doc["templating"]["list"]:
        if variable["type"] == "query":
            query: Any = variable["query"]
            queries.append(query["query"] if isinstance(query, dict) else query)
    return [_expand(q) for q in queries]


def rule_queries() -> list[str]:
    doc = yaml.safe_load(RULES.read_text())
    return [rule["expr"] for group in doc["groups"] for rule in group["rules"]]


def metric_names(queries: list[str]) -> set[str]:
    return {name for q in queries for name in _METRIC.findall(q)}


def _expand(query: str) -> str:
    """The query with Grafana's variables replaced; ``label_values(metric, label)`` (a Grafana function, not
    PromQL) becomes the selector it queries."""
    for variable, value in _VARIABLES.items():
        query = query.replace(variable, value)
    return re.sub(r"^label_values\((\w+), \w+\)$", r"\1", query)


def promtool() -> str | None:
    return shutil.which("promtool")
