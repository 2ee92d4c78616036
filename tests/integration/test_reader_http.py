"""The HTTP fetch service on the real stack: `tiering reader serve` as real processes, a topic tiered by a
real sidecar (every codec, headers, null keys and values, a committed and an aborted transaction),
read from offset 0 raw (decoded by kafka-python, an independent decoder) and as JSON.

The tests share the tiered topic and run in file order: the ones that damage it (corrupt and delete
objects, expire copies by retention) come last."""

from __future__ import annotations

import base64
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

import httpx
import pytest
import schemathesis
from click.testing import CliRunner
from confluent_kafka import KafkaError, Message, Producer
from hypothesis import HealthCheck, given, settings
from kafka.record.memory_records import MemoryRecords
from schemathesis import GenerationMode
from schemathesis.checks import positive_data_acceptance

from deploy.stack import Endpoints
from reader import RemoteReader
from tests.conftest import create_topic, set_topic_config
from tests.fault_proxy import TcpProxy
from tests.reader_harness import LOCAL_RETENTION, SEGMENT, TieredTopic, expected, tiered_topic
from tests.s3_fault_proxy import RESET, SLOW_DOWN, S3FaultProxy
from tests.sidecar_harness import Produced, produce_mixed, wait_for
from tiering.cli.main import main

pytestmark = pytest.mark.integration

TOKENS = ("token-one", "token-two")


@dataclass
class Service:
    """A `tiering reader serve` process and a client authenticated with the first token."""

    url: str
    process: subprocess.Popen
    log: Path
    client: httpx.Client

    def get(self, path: str, **params: object) -> httpx.Response:
        return self.client.get(path, params=params)

    def stop(self) -> None:
        self.client.close()
        self.process.terminate()
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_service(config: Path, log: Path, **env: str) -> Service:
    """Start the service on a free port and wait until /readyz says the metadata is caught up."""
    port = free_port()
    environ = {**os.environ, "TIERING_HTTP__TOKENS": f'["{TOKENS[0]}", "{TOKENS[1]}"]', **env}
    out = log.open("wb")
    process = subprocess.Popen(
        [sys.executable, "-m", "tiering", "reader", "serve", "--config", str(config), "--port", str(port)],
        stdout=out, stderr=subprocess.STDOUT, env=environ,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    client = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {TOKENS[0]}"}, timeout=120)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        assert process.poll() is None, f"the service exited with {process.returncode}:\n{log.read_text()}"
        try:
            if client.get("/readyz").status_code == 200:
                return Service(url, process, log, client)
        except httpx.TransportError:
            pass
        time.sleep(0.3)
    process.kill()
    raise AssertionError(f"the service did not become ready:\n{log.read_text()}")


@dataclass
class Tiered:
    """The tiered topic, with more records produced after its transactions so that those are tiered too."""

    topic: TieredTopic
    produced: Produced

    @property
    def name(self) -> str:
        return self.topic.topic


@pytest.fixture(scope="module")
def tiered(stack: Endpoints, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tiered]:
    with tiered_topic(stack, tmp_path_factory.mktemp("reader-http")) as t:
        first = dict(t.produced)
        more = produce_mixed(stack.bootstrap, t.topic, 4000, seed=100_000)  # rolls the transactions' segment
        abort_marker = max(first) + 1
        wait_for(lambda: (t.remote_end() or 0) > abort_marker, 300, "the transactions to be tiered")
        yield Tiered(t, {**first, **more})


@pytest.fixture(scope="module")
def services(tiered: Tiered, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Service]]:
    """Two instances of the service on the same configuration (as behind a load balancer)."""
    logs = tmp_path_factory.mktemp("reader-http-logs")
    started = [start_service(tiered.topic.config, logs / f"service-{i}.log") for i in range(2)]
    yield started
    for s in started:
        s.stop()


def path(t: Tiered, what: str = "", partition: int = 0) -> str:
    return f"/v1/topics/{t.name}/partitions/{partition}{what}"


def read_raw(services: list[Service], t: Tiered, isolation: str, max_bytes: int) -> tuple[list[bytes], dict]:
    """Every body from offset 0 until the 416 at the remote end, alternating between the instances."""
    bodies: list[bytes] = []
    offset = 0
    for i in range(100_000):
        r = services[i % len(services)].get(path(t, "/batches"), offset=offset, max_bytes=max_bytes,
                                            isolation_level=isolation)  # fmt: skip
        if r.status_code == 416:
            return bodies, r.json()
        assert r.status_code == 200, r.text
        assert r.headers["content-type"] == "application/octet-stream"
        next_offset = int(r.headers["Kafka-Next-Offset"])
        assert next_offset > offset, "the next offset does not advance"
        count = int(r.headers["Kafka-Record-Batches"])
        assert count == len(list(batches(r.content)))
        assert len(r.content) <= max_bytes or count == 1, "more than max_bytes, beyond the one batch Kafka allows"
        bodies.append(r.content)
        offset = next_offset
    raise AssertionError("the remote end was never reached")


def batches(body: bytes):
    records = MemoryRecords(body)
    while (batch := records.next_batch()) is not None:
        yield batch


def decode_independently(bodies: list[bytes]) -> dict[int, tuple]:
    """kafka-python's parsing of the raw bodies: offset -> (key, value, headers, is_control)."""
    out: dict[int, tuple] = {}
    for body in bodies:
        for batch in batches(body):
            assert batch.validate_crc(), f"batch at offset {batch.base_offset} fails kafka-python's CRC check"
            for r in batch:
                if r.offset in out:  # a page may begin with the batch that the last page ended in
                    assert out[r.offset] == (r.key, r.value, list(r.headers), batch.is_control_batch)
                    continue
                out[r.offset] = (r.key, r.value, list(r.headers), batch.is_control_batch)
    return out


def test_raw_batches_are_the_remote_objects_and_every_produced_record(services: list[Service], tiered: Tiered) -> None:
    bodies, end = read_raw(services, tiered, "read_uncommitted", 50_000)
    ry = end["remote_end_offset"]
    assert end["error"] == "OFFSET_OUT_OF_RANGE" and end["offset"] == ry + 1
    assert end["log_start_offset"] is not None and end["log_start_offset"] <= ry + 1, "a gap before the broker"
    assert "the broker serves it" in end["message"]
    with RemoteReader.open(tiered.topic.reader_settings(), [tiered.name]) as reader:
        copies = [reader.locate(tiered.name, 0, c.base_offset) for c in reader.catalog.copies(tiered.name, 0)]
        objects = b"".join(reader.fetcher.store.get_bytes(c.log_key) for c in copies if c.end_offset <= ry)
    assert b"".join(bodies) == objects, "the bodies are not the remote objects' bytes, in order, once each"
    decoded = decode_independently(bodies)
    assert sorted(decoded) == list(range(ry + 1)), "offsets missing or extra"
    for offset, (key, value, headers, control) in decoded.items():
        if offset in tiered.produced:
            assert (key, value, headers) == tiered.produced[offset], f"offset {offset} differs from what was produced"
        else:
            assert control, f"offset {offset} is neither produced nor a transaction marker"


def read_json(service: Service, t: Tiered, **params: object) -> tuple[list[dict], dict]:
    records: list[dict] = []
    offset = 0
    while True:
        r = service.get(path(t, "/records"), offset=offset, **params)
        if r.status_code == 416:
            return records, r.json()
        assert r.status_code == 200, r.text
        page = r.json()
        assert page["offset"] == offset and page["next_offset"] > offset
        assert len(page["records"]) <= params.get("max_records", 500), "more records than asked for"
        records += page["records"]
        offset = page["next_offset"]


def unb64(text: str | None) -> bytes | None:
    return None if text is None else base64.b64decode(text)


@pytest.mark.parametrize("max_records", [1000, 10_000])
def test_json_records_are_every_produced_record_in_order(
    services: list[Service], tiered: Tiered, max_records: int
) -> None:
    records, end = read_json(services[0], tiered, max_records=max_records, max_bytes=200_000)
    ry = end["remote_end_offset"]
    offsets = [r["offset"] for r in records]
    assert offsets == sorted(set(offsets)), "records out of order or served twice"
    assert offsets == [o for o in sorted(tiered.produced) if o <= ry], "not exactly the produced records up to Ry"
    for r in records:
        key, value, headers = tiered.produced[r["offset"]]
        assert (unb64(r["key"]), unb64(r["value"])) == (key, value), f"offset {r['offset']} differs"
        assert [(h["key"], unb64(h["value"])) for h in r["headers"]] == headers
        assert r["timestamp_type"] == "CreateTime" and r["timestamp"] > 1_600_000_000_000
        assert r["leader_epoch"] is not None and r["leader_epoch"] >= 0


def test_json_utf8_encoding_gives_the_text(services: list[Service], tiered: Tiered) -> None:
    r = services[1].get(path(tiered, "/records"), offset=0, max_records=50, encoding="utf-8")
    assert r.status_code == 200, r.text
    page = r.json()
    assert page["encoding"] == "utf-8" and len(page["records"]) == 50
    for rec in page["records"]:
        key, value, headers = tiered.produced[rec["offset"]]
        assert rec["key"] == (key.decode() if key is not None else None)
        assert rec["value"] == (value.decode() if value is not None else None)
        assert [(h["key"], h["value"]) for h in rec["headers"]] == [(k, v and v.decode()) for k, v in headers]


def test_read_committed_drops_aborted_records_and_markers(services: list[Service], tiered: Tiered) -> None:
    bodies, end = read_raw(services, tiered, "read_committed", 30_000)
    ry = end["remote_end_offset"]
    committed = {o for o in expected(tiered.produced, read_committed=True) if o <= ry}
    assert len(committed) < len([o for o in tiered.produced if o <= ry]), "no aborted record in the remote range"
    decoded = decode_independently(bodies)
    assert set(decoded) == committed, "read_committed served other records than the committed ones"
    assert not any(control for *_, control in decoded.values()), "a control batch was served"
    records, _ = read_json(services[0], tiered, isolation_level="read_committed", max_records=3000)
    assert [r["offset"] for r in records] == sorted(committed)
    txn = [o for o, (k, _, _) in tiered.produced.items() if k and k.startswith(b"txn-True-") and o <= ry]
    assert txn and set(txn) <= set(decoded), "the committed transaction is missing"


def test_bad_requests_get_4xx_with_a_message(services: list[Service], tiered: Tiered) -> None:
    s = services[0]
    anonymous = httpx.get(f"{s.url}{path(tiered, '/records')}", params={"offset": 0}, timeout=30)
    assert anonymous.status_code == 401 and anonymous.headers["www-authenticate"].startswith("Bearer")
    assert anonymous.json()["error"] == "UNAUTHORIZED" and "bearer token" in anonymous.json()["message"]
    wrong = httpx.get(f"{s.url}{path(tiered, '/batches')}", params={"offset": 0}, timeout=30,
                      headers={"Authorization": "Bearer not-a-token"})  # fmt: skip
    assert wrong.status_code == 401 and "not accepted" in wrong.json()["message"]
    second = httpx.get(f"{s.url}{path(tiered)}", timeout=30, headers={"Authorization": f"Bearer {TOKENS[1]}"})
    assert second.status_code == 200 and second.json()["remote_start_offset"] == 0

    cases = {
        (path(tiered, "/records"), "offset", -1): 422,
        (path(tiered, "/records"), "offset", "x"): 422,
        (path(tiered, "/batches"), "max_bytes", 1 << 40): 422,
        (path(tiered, "/records"), "max_records", 0): 422,
        (path(tiered, "/records"), "encoding", "latin-1"): 422,
        (path(tiered, "/batches"), "isolation_level", "read_dirty"): 422,
    }
    for (where, name, value), status in cases.items():
        params = {"offset": 0, name: value}
        r = s.get(where, **params)
        assert r.status_code == status, (name, value, r.text)
        body = r.json()
        assert body["error"] == "INVALID_REQUEST" and name in body["message"], body
    missing = s.get(path(tiered, "/records"))
    assert missing.status_code == 422 and "offset" in missing.json()["message"]
    bad_name = s.get(f"/v1/topics/{'x' * 250}/partitions/0/records", offset=0)
    assert bad_name.status_code == 422 and "topic" in bad_name.json()["message"]

    unknown = s.get("/v1/topics/no-such-topic-here/partitions/0/records", offset=0)
    assert unknown.status_code == 404 and unknown.json()["error"] == "UNKNOWN_TOPIC_OR_PARTITION"
    assert "no-such-topic-here" in unknown.json()["message"]
    partition = s.get(path(tiered, "/batches", partition=7), offset=0)
    assert partition.status_code == 404 and "no partition 7" in partition.json()["message"]


def test_openapi_describes_the_endpoints_and_health(services: list[Service], tiered: Tiered) -> None:
    s = services[1]
    spec = httpx.get(f"{s.url}/openapi.json", timeout=30).json()
    assert spec["openapi"].startswith("3.")
    batches_op = spec["paths"]["/v1/topics/{topic}/partitions/{partition}/batches"]["get"]
    assert "application/octet-stream" in batches_op["responses"]["200"]["content"]
    assert {"401", "404", "416", "422", "502", "503"} <= set(batches_op["responses"])
    params = {p["name"]: p for p in batches_op["parameters"]}
    assert params["max_bytes"]["schema"]["maximum"] == 16 << 20
    assert spec["components"]["securitySchemes"]["HTTPBearer"]["scheme"] == "bearer"
    assert httpx.get(f"{s.url}/healthz", timeout=30).json() == {"status": "ok", "message": None}
    assert httpx.get(f"{s.url}/readyz", timeout=30).status_code == 200


@pytest.mark.parametrize("mode", ["positive", "negative"])
def test_schemathesis_finds_the_openapi_description_true(services: list[Service], tiered: Tiered, mode: str) -> None:
    """Requests generated from the served OpenAPI (valid ones, then invalid ones), against the tiered topic
    and against made-up names: every answer has a documented status, content type, headers and schema,
    invalid ones are refused. (A valid request may get 404 or 416: made-up names, offsets past the data.)"""
    s = services[0]
    schema = schemathesis.openapi.from_url(f"{s.url}/openapi.json")
    auth = {"Authorization": f"Bearer {TOKENS[0]}"}
    for result in schema.get_all_operations():
        operation = result.ok()
        variants: list[dict | None] = [None]
        if mode == "positive" and "{topic}" in operation.path:
            variants.append({"topic": tiered.name, "partition": 0})
        elif mode == "negative" and not list(operation.iter_parameters()):
            continue  # nothing to make invalid
        for path_parameters in variants:
            strategy = operation.as_strategy(GenerationMode(mode), path_parameters=path_parameters)

            @given(case=strategy)
            @settings(max_examples=25, deadline=None, database=None, suppress_health_check=list(HealthCheck))
            def check(case: schemathesis.Case) -> None:
                case.call_and_validate(base_url=s.url, headers=auth, excluded_checks=[positive_data_acceptance])

            check()


def test_metrics_count_remote_fetches(services: list[Service], tiered: Tiered) -> None:
    s = services[0]
    assert s.get(path(tiered, "/batches"), offset=0).status_code == 200
    text = httpx.get(f"{s.url}/metrics", timeout=30).text
    labels = f'partition="0",topic="{tiered.name}"'
    for name in ("tiering_remote_fetch_requests_total", "tiering_remote_fetch_bytes_total"):
        value = next(float(line.split()[-1]) for line in text.splitlines() if line.startswith(f"{name}{{{labels}}}"))
        assert value > 0, name
    assert "tiering_reader_store_bytes_total" in text and "tiering_reader_memory_pool_bytes" in text
    assert 'route="/v1/topics/{topic}/partitions/{partition}/batches"' in text


def sample(text: str, name: str) -> float:
    """The value of the unlabelled sample ``name`` in a Prometheus text exposition."""
    return next(float(line.split()[-1]) for line in text.splitlines() if line.startswith(f"{name} "))


def test_store_down_gives_bounded_retries_then_503_and_reads_resume(
    tiered: Tiered, stack: Endpoints, tmp_path: Path
) -> None:
    target = urlparse(stack.s3.endpoint_url)
    proxy = TcpProxy(target.hostname or "127.0.0.1", target.port or 80)
    env = {
        "TIERING_REMOTE_STORAGE__ENDPOINT_URL": f"http://127.0.0.1:{proxy.port}",
        "TIERING_READ_ATTEMPTS": "3",
        "TIERING_READ_RETRY_BACKOFF_SECONDS": "0.1",
    }
    service = start_service(tiered.topic.config, tmp_path / "service.log", **env)
    try:
        proxy.cut()
        failed = service.get(path(tiered, "/records"), offset=0)
        assert failed.status_code == 503, failed.text
        body = failed.json()
        assert body["error"] == "REMOTE_STORAGE_UNAVAILABLE" and "after 3 attempts" in body["message"]
        assert body["key"].startswith(f"{tiered.name}-")  # the copy's key under the cluster's prefix
        assert f"/{tiered.topic.reader_settings().remote_storage.prefix}/{body['key']}" in body["message"]
        assert failed.headers["retry-after"]
        metrics = httpx.get(f"{service.url}/metrics", timeout=30).text
        assert f'tiering_remote_fetch_errors_total{{partition="0",topic="{tiered.name}"}} 1.0' in metrics
        assert "tiering_reader_store_unavailable 1.0" in metrics
        assert sample(metrics, "tiering_reader_store_retries_total") >= 2  # 3 attempts: 2 retries
        proxy.restore()
        resumed = service.get(path(tiered, "/records"), offset=0, max_records=100)
        assert resumed.status_code == 200, resumed.text
        assert "tiering_reader_store_unavailable 0.0" in httpx.get(f"{service.url}/metrics", timeout=30).text
        got = [(r["offset"], unb64(r["key"]), unb64(r["value"])) for r in resumed.json()["records"]]
        assert got == [(o, *tiered.produced[o][:2]) for o in range(100)]
    finally:
        service.stop()
        proxy.close()


def test_a_throttling_store_is_retried_and_every_offset_served(
    tiered: Tiered, stack: Endpoints, tmp_path: Path
) -> None:
    """Every distinct GET's answer cut mid-body, then 503 SlowDown twice: the service's presigned ranged GETs are
    retried (``read_attempts``: the 4th gets it) and the raw read from offset 0 is every record, byte for byte."""
    with S3FaultProxy(stack.s3.endpoint_url) as proxy:
        env = {"TIERING_REMOTE_STORAGE__ENDPOINT_URL": proxy.endpoint_url, "TIERING_READ_ATTEMPTS": "4",
               "TIERING_READ_RETRY_BACKOFF_SECONDS": "0.01"}  # fmt: skip
        service = start_service(tiered.topic.config, tmp_path / "service.log", **env)
        try:
            proxy.throttle("GetObject", RESET, SLOW_DOWN, SLOW_DOWN)
            bodies, end = read_raw([service], tiered, "read_uncommitted", 200_000)
        finally:
            service.stop()
    decoded = decode_independently(bodies)
    assert sorted(decoded) == list(range(end["remote_end_offset"] + 1)), "offsets missing or extra"
    for offset, (key, value, headers, control) in decoded.items():
        assert control or (key, value, headers) == tiered.produced[offset], f"offset {offset} differs"
    assert proxy.injected[("GetObject", SLOW_DOWN.name)] >= 2 * proxy.injected[("GetObject", RESET.name)] >= 20
    assert proxy.presigned["GetObject"] >= 30, "the ranged GETs did not go through SigV4 presigned URLs"


def topic_command(t: Tiered, command: str) -> None:
    result = CliRunner().invoke(main, ["topic", command, t.name, "--config", str(t.topic.config)])
    assert result.exit_code == 0, result.output


def test_pause_download_is_honoured_until_resumed(services: list[Service], tiered: Tiered) -> None:
    s = services[1]
    topic_command(tiered, "pause-download")
    try:
        wait_for(lambda: s.get(path(tiered, "/batches"), offset=0).status_code == 503, 60, "the pause to be seen")
        body = s.get(path(tiered, "/records"), offset=0).json()
        assert body["error"] == "DOWNLOAD_PAUSED" and f"resume-download {tiered.name}" in body["message"]
    finally:
        topic_command(tiered, "resume-download")
    wait_for(lambda: s.get(path(tiered, "/batches"), offset=0).status_code == 200, 60, "the resume to be seen")


def produce_aborted_transaction(bootstrap: str, topic: str, count: int) -> list[int]:
    """One transaction of ``count`` records, large enough to span several segments, then aborted: its marker
    lands in the active segment, so the remote data holds the records without their outcome for a while."""
    offsets: list[int] = []

    def delivered(err: KafkaError | None, msg: Message) -> None:
        assert err is None, f"delivery failed: {err}"
        offsets.append(msg.offset())

    txn = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"{topic}-long", "linger.ms": 5,
                    "batch.size": 16384})  # fmt: skip
    txn.init_transactions(60)
    txn.begin_transaction()
    for i in range(count):
        txn.produce(topic, key=f"long-{i}".encode(), value=b"x" * 100, on_delivery=delivered)
        txn.poll(0)
    txn.flush(60)
    txn.abort_transaction(60)
    assert len(offsets) == count
    return sorted(offsets)


def read_pages(s: Service, topic: str, offset: int, until: Callable[[dict], bool], **params: object) -> list[dict]:
    """JSON pages from ``offset`` on, through the one for which ``until`` holds."""
    pages = []
    for _ in range(10_000):
        r = s.get(f"/v1/topics/{topic}/partitions/0/records", offset=offset, **params)
        assert r.status_code == 200, r.text
        pages.append(r.json())
        if until(pages[-1]):
            return pages
        offset = pages[-1]["next_offset"]
    raise AssertionError("the page looked for never came")


def test_read_committed_stops_where_a_transaction_outcome_is_not_remote_yet(
    services: list[Service], tiered: Tiered, stack: Endpoints
) -> None:
    s = services[0]
    topic = create_topic(stack.bootstrap, 1, internal_segment_bytes=SEGMENT)
    before = produce_mixed(stack.bootstrap, topic, 1000)
    aborted = produce_aborted_transaction(stack.bootstrap, topic, 3000)
    result = CliRunner().invoke(main, ["topic", "enable", topic, "--local-retention-bytes", str(LOCAL_RETENTION),
                                       "--config", str(tiered.topic.config)])  # fmt: skip
    assert result.exit_code == 0, result.output
    remote_end = lambda: s.get(f"/v1/topics/{topic}/partitions/0").json()["remote_end_offset"] or -1  # noqa: E731
    wait_for(lambda: remote_end() >= aborted[len(aborted) // 2], 180, "the open transaction's segments to tier")
    assert remote_end() < aborted[-1] + 1, "the abort marker is remote already"

    committed = read_pages(s, topic, 0, lambda p: p["last_stable_offset"] is not None, isolation_level="read_committed")
    stop = committed[-1]
    assert stop["last_stable_offset"] == stop["next_offset"] == aborted[0], "not stopped at the open transaction"
    assert [r["offset"] for p in committed for r in p["records"]] == sorted(expected(before, read_committed=True))
    raw = s.get(f"/v1/topics/{topic}/partitions/0/batches", offset=aborted[0], isolation_level="read_committed")
    assert raw.status_code == 200 and raw.content == b"", "records of a transaction with no known outcome served"
    assert raw.headers["Kafka-Last-Stable-Offset"] == raw.headers["Kafka-Next-Offset"] == str(aborted[0])
    uncommitted = s.get(f"/v1/topics/{topic}/partitions/0/records", offset=aborted[0], max_records=10).json()
    assert [r["offset"] for r in uncommitted["records"]] == aborted[:10], "read_uncommitted delivers them, as a broker"

    after = produce_mixed(stack.bootstrap, topic, 8000, seed=7)  # rolls the segment holding the abort marker
    wait_for(lambda: remote_end() > aborted[-1] + 1, 180, "the abort marker and later records to tier")
    resumed = read_pages(s, topic, aborted[0], lambda p: bool(p["records"]), isolation_level="read_committed")
    assert all(not p["records"] for p in resumed[:-1]) and resumed[-1]["last_stable_offset"] is None
    assert resumed[-1]["records"][0]["offset"] == min(after), "the aborted transaction was not skipped exactly"


def test_corrupt_or_deleted_object_is_an_error_naming_the_key(services: list[Service], tiered: Tiered) -> None:
    s = services[0]
    with RemoteReader.open(tiered.topic.reader_settings(), [tiered.name]) as reader:
        store = reader.fetcher.store
        copies = reader.catalog.copies(tiered.name, 0)
        damaged = reader.locate(tiered.name, 0, copies[-3].base_offset)
        original = store.get_bytes(damaged.log_key)
        body = bytearray(original)
        body[len(body) // 2] ^= 0xFF
        store.put_bytes(damaged.log_key, bytes(body))
        gone = reader.locate(tiered.name, 0, copies[-2].base_offset)
        gone_bytes = store.get_bytes(gone.log_key)
        store.delete([gone.log_key])

    offset = damaged.base_offset
    while True:  # pages before the damaged byte are served; the damaged range never is
        r = s.get(path(tiered, "/records"), offset=offset, max_bytes=4096)
        if r.status_code != 200:
            break
        for rec in r.json()["records"]:
            assert (unb64(rec["key"]), unb64(rec["value"])) == tiered.produced[rec["offset"]][:2]
        offset = r.json()["next_offset"]
        assert offset <= damaged.end_offset, "the whole damaged copy was served"
    assert r.status_code == 502 and r.json()["error"] == "CORRUPT_MESSAGE", r.text
    assert r.json()["key"] == damaged.log_key and damaged.log_key in r.json()["message"]

    r = s.get(path(tiered, "/batches"), offset=gone.base_offset)
    assert r.status_code == 502, r.text
    assert r.json()["error"] == "REMOTE_OBJECT_MISSING" and r.json()["key"] == gone.log_key

    store.put_bytes(damaged.log_key, original)  # repaired: served again, nothing of the damage kept
    store.put_bytes(gone.log_key, gone_bytes)
    for offset in (damaged.base_offset, gone.base_offset):
        r = s.get(path(tiered, "/records"), offset=offset, max_bytes=4096)
        assert r.status_code == 200, r.text
        records = r.json()["records"]
        assert records and records[0]["offset"] >= offset
        assert all((unb64(rec["key"]), unb64(rec["value"])) == tiered.produced[rec["offset"]][:2] for rec in records)


def test_offset_below_the_remote_start_is_out_of_range(
    services: list[Service], tiered: Tiered, stack: Endpoints
) -> None:
    """Total retention expires the oldest copies (Rx > 0): an offset below answers like a broker's
    OFFSET_OUT_OF_RANGE, naming the remote start, and reading goes on from there."""
    with RemoteReader.open(tiered.topic.reader_settings(), [tiered.name]) as reader:
        copies = reader.catalog.copies(tiered.name, 0)
        keep = sum(c.size for c in copies[2:])
    set_topic_config(stack.bootstrap, tiered.name, retention_bytes=keep)
    s = services[1]
    wait_for(lambda: (s.get(path(tiered)).json()["remote_start_offset"] or 0) > 0, 120, "copies to expire")
    rx = s.get(path(tiered)).json()["remote_start_offset"]  # retention may go on expiring: Rx only grows
    for endpoint in ("/records", "/batches"):
        r = s.get(path(tiered, endpoint), offset=rx - 1)
        assert r.status_code == 416, r.text
        body = r.json()
        assert body["error"] == "OFFSET_OUT_OF_RANGE" and body["offset"] == rx - 1
        assert body["remote_start_offset"] >= rx and body["remote_end_offset"] >= body["remote_start_offset"]
        assert f"below the remote start {body['remote_start_offset']}" in body["message"]
        rx = body["remote_start_offset"]
    r = s.get(path(tiered, "/records"), offset=rx, max_records=10)
    assert r.status_code in (200, 416), r.text
    if r.status_code == 200:  # else expired meanwhile: the answer names the newer remote start
        assert r.json()["records"][0]["offset"] >= rx
    else:
        assert r.json()["remote_start_offset"] > rx
