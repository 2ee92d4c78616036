"""The sidecar's metrics: a partition's series can be removed all together; failing operations are exported."""

from __future__ import annotations

import urllib.request

from prometheus_client.metrics import MetricWrapperBase

from tiering.metrics import SidecarMetrics
from tiering.sidecar.endpoint import StatusEndpoint
from tiering.sidecar.retry import SIDECAR, Retrier, Scope
from tiering_core.backoff import Backoff


def test_forget_partition_removes_every_series_of_that_partition_and_only_those() -> None:
    metrics = SidecarMetrics()
    labelled = [m for m in vars(metrics).values() if isinstance(m, MetricWrapperBase) and "partition" in m._labelnames]
    assert {id(m) for m in labelled} == {id(m) for m in metrics.per_partition}, "a partition metric is not forgotten"
    for metric in labelled:
        for topic, partition in (("a", "0"), ("a", "1"), ("b", "0")):
            for operation in ("copy", "sweep") if "operation" in metric._labelnames else (None,):
                extra = {"operation": operation} if operation else {}
                metric.labels(topic=topic, partition=partition, **extra).inc()
    metrics.metadata_wal_lag.labels(wal_partition="0").set(3)
    metrics.forget_partition({"topic": "a", "partition": "0"})
    metrics.forget_partition({"topic": "a", "partition": "0"})  # idempotent
    left = {
        (family.name, s.labels.get("topic"), s.labels.get("partition"))
        for family in metrics.registry.collect()
        for s in family.samples
    }
    assert not {row for row in left if row[1:] == ("a", "0")}
    for metric in labelled:
        name = metric._name
        assert {(name, "a", "1"), (name, "b", "0")} <= left
    assert ("tiering_metadata_wal_lag_records", None, None) in left


def test_consecutive_failures_are_exported_while_an_operation_fails_and_gone_once_it_succeeds() -> None:
    metrics = SidecarMetrics()
    retrier = Retrier(Backoff(3600.0, 3600.0, jitter=0.0), metrics.task_errors, metrics.registry)
    scope = Scope("orders", "id", 3)

    def failures() -> dict[tuple[str, str, str], float]:
        return {
            (s.labels["topic"], s.labels["partition"], s.labels["operation"]): s.value
            for family in metrics.registry.collect()
            for s in family.samples
            if s.name == "tiering_task_consecutive_failures"
        }

    retrier.failed(scope, "copy", OSError("store says no"))
    retrier.failed(scope, "copy", OSError("store says no"))
    retrier.failed(SIDECAR, "tick", OSError("etcd says no"))
    assert failures() == {("orders", "3", "copy"): 2, ("", "", "tick"): 1}
    retrier.succeeded(scope, "copy")
    assert failures() == {("", "", "tick"): 1}


def test_the_endpoint_serves_only_the_named_samples_when_asked() -> None:
    """``/metrics?name[]=...``: polling one counter does not make the sidecar render every partition's series."""
    metrics = SidecarMetrics()
    metrics.ticks.labels(kind="full").inc()
    metrics.copy_lag_bytes.labels(topic="a", partition="0").set(5)
    endpoint = StatusEndpoint("127.0.0.1", 0, metrics.registry, dict)
    try:
        url = f"http://{endpoint.address}/metrics"
        with urllib.request.urlopen(url + "?name[]=tiering_sidecar_ticks_total", timeout=10) as r:
            some = r.read().decode()
        with urllib.request.urlopen(url, timeout=10) as r:
            every = r.read().decode()
    finally:
        endpoint.close()
    assert 'tiering_sidecar_ticks_total{kind="full"} 1.0' in some and "copy_lag" not in some
    assert 'tiering_sidecar_ticks_total{kind="full"} 1.0' in every and "copy_lag" in every
