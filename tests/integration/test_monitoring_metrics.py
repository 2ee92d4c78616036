"""The shipped dashboard and alert rules (deploy/monitoring/) use only metrics the services export: read from
the live ``/metrics`` of a sidecar tiering a topic, of the reader HTTP service and of the access layer, each
having served that topic's remote part."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from deploy.procs import free_port
from deploy.stack import Endpoints
from tests.integration.test_reader_http import start_service
from tests.monitoring import dashboard_queries, metric_names, rule_queries
from tests.proxy_harness import check_exact, proxy_bootstrap, proxy_for, read_all
from tests.reader_harness import expected, tiered_topic

pytestmark = pytest.mark.integration

# The names under which a family of each type is queried: a counter ``x`` is ``x_total``, a histogram its buckets.
_SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",), "untyped": ("",)}


def exported(url: str) -> set[str]:
    """The metric names a ``/metrics`` page exports, a family without a series yet included (an errors counter
    before the first error is a HELP and a TYPE line): Prometheus gets its series as soon as there are some."""
    response = httpx.get(url, timeout=30)
    assert response.status_code == 200, response.text
    return {
        family.name + suffix
        for family in text_string_to_metric_families(response.text)
        for suffix in _SUFFIXES[family.type]
    }


def test_every_metric_the_dashboard_and_the_rules_use_is_exported(stack: Endpoints, tmp_path: Path) -> None:
    sidecar_port, proxy_port = free_port(), free_port()
    with tiered_topic(stack, tmp_path, metrics_port=sidecar_port) as tiered:
        service = start_service(tiered.config, tmp_path / "reader-http.log")
        try:
            fetched = service.get(f"/v1/topics/{tiered.topic}/partitions/0/batches", offset=0)
            assert fetched.status_code == 200, fetched.text
            http = exported(f"{service.url}/metrics")
        finally:
            service.stop()
        with proxy_for(tiered.config, stack.bootstrap, metrics_port=proxy_port) as proxy:
            read = read_all(proxy_bootstrap(proxy), tiered.topic, {0: tiered.end_offset()})
            want = expected(tiered.produced, read_committed=True)  # librdkafka's default isolation
            check_exact([(m.offset(), (m.key(), m.value())) for m in read[0]], {o: r[:2] for o, r in want.items()})
            access_layer = exported(f"http://127.0.0.1:{proxy_port}/metrics")
        sidecar = exported(f"http://127.0.0.1:{sidecar_port}/metrics")
    assert "tiering_remote_copy_lag_bytes" in sidecar and "tiering_remote_fetch_bytes_total" in http
    assert "tiering_proxy_fetch_partitions_total" in access_layer
    everything = sidecar | http | access_layer
    for what, queries in (("dashboard", dashboard_queries()), ("alert rules", rule_queries())):
        missing = metric_names(queries) - everything
        assert not missing, f"the {what} use metrics no service exports: {sorted(missing)}"
