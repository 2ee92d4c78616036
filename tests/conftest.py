"""Fixtures that start the real local stack (Kafka, MinIO, etcd) for integration tests.

The stack is started once per test session in a temporary directory and stopped at the end, on the
backend named by ``TIERING_TEST_BACKEND``: ``processes`` (local processes, the default) or
``containers`` (containers of locally built images on podman, through testcontainers). Either way the
fixtures return the same ``deploy.stack.Endpoints``, so a test runs unchanged on both; broker faults go
through ``deploy.stack`` (``kill_broker``, ``restart_broker``, ``pause_broker``...), which acts on the
stack's own backend.

Markers: ``containers`` tests also run in the containers pass of .ci/run
(``TIERING_TEST_BACKEND=containers python -m pytest -m "containers or containers_only"``);
``containers_only`` tests need that backend (sidecar containers beside the brokers) and are deselected
on the other.

Set ``TIERING_TEST_STACK_DIR`` to reuse a stack started with ``tiering dev up --dir ...`` (it is
left running). A component that cannot start skips the test, except under ``CI=true``, where the
test fails: CI must never go green on tests that did not run.
"""

from __future__ import annotations

import contextlib
import gc
import os
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NoReturn

import pytest
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, NewTopic

from deploy import stack as stack_mod
from deploy.errors import StackError
from deploy.stack import BACKENDS, Backend, Endpoints
from tests.kafka_clients import holders, in_call_on_thread, open_clients

BACKEND_ENV = "TIERING_TEST_BACKEND"


def stack_backend() -> Backend:
    """The backend the fixtures start stacks on: ``$TIERING_TEST_BACKEND``, else ``processes``."""
    name = os.environ.get(BACKEND_ENV) or "processes"
    for backend in BACKENDS:
        if backend == name:
            return backend
    raise pytest.UsageError(f"{BACKEND_ENV}={name!r}: use one of {', '.join(BACKENDS)}")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Deselect ``containers_only`` tests unless the fixtures start containers."""
    if stack_backend() == "containers":
        return
    keep = [item for item in items if item.get_closest_marker("containers_only") is None]
    if len(keep) != len(items):
        config.hook.pytest_deselected(items=[item for item in items if item not in keep])
        items[:] = keep


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Destroy what the tests left unreachable while the interpreter is whole: a librdkafka client
    destroyed later, during interpreter exit, can call back into Python (its log callback) and crash
    the process after every test passed."""
    gc.collect()


_OPEN_BEFORE: set[int] = set()  # ids of the clients open when the previous module ended
_IN_FLIGHT_GRACE_SECONDS = 90.0  # above the longest request timeout of the components' threads


@pytest.fixture(scope="module", autouse=True)
def _kafka_clients_released(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fail a module that leaves a confluent-kafka client open after its last test (and its module
    fixtures: autouse, this one is torn down after them), naming what still holds each one.

    Open means the librdkafka handle still exists (``tests/kafka_clients.py``): a Consumer or Producer
    not closed and still referenced, or an AdminClient still referenced (it has no ``close()``; only
    dropping the last reference destroys it). Such a client keeps reconnecting once the stack has
    stopped ("Connection refused" at the end of the session) and can crash the interpreter's exit.
    Clients already open when the previous module ended (a session fixture's, or another module's,
    reported there) are left out. One ``gc.collect()`` and one scan of the heap per module; while a leaked client
    is still in use by a call on a thread of its own (a component's daemon thread finishing its last request,
    bounded by that request's timeout, after the component was closed), the scan is repeated for up to
    ``_IN_FLIGHT_GRACE_SECONDS``: the client is released when that call returns, or reported."""
    yield
    deadline = time.monotonic() + _IN_FLIGHT_GRACE_SECONDS
    while True:
        gc.collect()
        found = open_clients()
        leaked = [client for client in found if id(client) not in _OPEN_BEFORE]
        if not leaked or time.monotonic() >= deadline or not any(in_call_on_thread(c) for c in leaked):
            break
        del found, leaked
        time.sleep(1.0)
    _OPEN_BEFORE.clear()
    _OPEN_BEFORE.update(id(client) for client in found)
    if leaked:
        lines = [f"{type(client).__name__} held by {holders(client, ignore=(found, leaked))}" for client in leaked]
        del found, leaked
        pytest.fail(f"{request.node.nodeid} left Kafka clients open:\n  " + "\n  ".join(lines), pytrace=False)


def unavailable(what: str, exc: Exception) -> NoReturn:
    message = f"{what} could not start: {exc}"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


def _start(tmp_path_factory: pytest.TempPathFactory, name: str, brokers: int) -> Iterator[Endpoints]:
    reuse = os.environ.get(f"TIERING_TEST_STACK{'' if brokers == 1 else brokers}_DIR")
    stack_dir = Path(reuse) if reuse else tmp_path_factory.mktemp(name)
    backend = None if reuse else stack_backend()
    try:
        endpoints = stack_mod.start(stack_dir, brokers=brokers, backend=backend)
    except StackError as exc:
        with contextlib.suppress(StackError):
            stack_mod.stop(stack_dir)
        unavailable(f"the local stack ({brokers} broker(s), {backend or 'reused'} backend)", exc)
    try:
        yield endpoints
    finally:
        if not reuse:
            stack_mod.stop(stack_dir)


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Endpoints]:
    """One Kafka broker, MinIO and etcd, shared by the whole session."""
    yield from _start(tmp_path_factory, "stack", 1)


@pytest.fixture(scope="session")
def stack3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Endpoints]:
    """Three Kafka nodes (KRaft combined, 3 voters), MinIO and etcd; started only when requested."""
    yield from _start(tmp_path_factory, "stack3", 3)


def create_topic(bootstrap: str, partitions: int = 1, replication: int = 1, **configs: Any) -> str:
    """Create a uniquely named topic; config names use underscores for dots (segment_bytes=...)."""
    name = f"t-{uuid.uuid4().hex[:10]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    topic_config = {k.replace("_", "."): str(v) for k, v in configs.items()}
    futures = admin.create_topics(
        [NewTopic(name, num_partitions=partitions, replication_factor=replication, config=topic_config)]
    )
    futures[name].result(timeout=60)
    return name


def set_topic_config(bootstrap: str, topic: str, **configs: Any) -> None:
    """Change some of a topic's configs, keeping the others (incremental, not a full replace)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    entries = [
        ConfigEntry(k.replace("_", "."), str(v), incremental_operation=AlterConfigOpType.SET)
        for k, v in configs.items()
    ]
    resource = ConfigResource("topic", topic, incremental_configs=entries)
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(30)


@pytest.fixture
def make_topic(stack: Endpoints) -> Callable[..., str]:
    """``make_topic(partitions=1, replication=1, segment_bytes=65536, ...) -> topic name``."""

    def make(partitions: int = 1, replication: int = 1, **configs: Any) -> str:
        return create_topic(stack.bootstrap, partitions, replication, **configs)

    return make


@pytest.fixture
def s3(stack: Endpoints) -> Any:
    """A boto3 S3 client for the stack's MinIO."""
    return stack_mod.s3_client(stack)
