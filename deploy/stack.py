"""The local stack: Kafka (KRaft, 1 or 3 combined nodes), MinIO and etcd, on one of two backends.

- ``processes`` (the default): local processes on 127.0.0.1 (``deploy.process_stack``);
- ``containers``: containers of locally built images, driven through podman's Docker-compatible API
  with testcontainers (``deploy.container_stack``), each port published on 127.0.0.1.

Either way ``start(stack_dir)`` brings everything up and writes ``<stack_dir>/endpoints.json``, the
one file the CLI, the demo, the benchmarks and the tests read, with every address reachable from the
host and the brokers' log dirs as host paths. It is idempotent: on a running stack it returns the
recorded endpoints. ``stop`` is idempotent too. The functions taking ``Endpoints`` (kill, restart,
pause a broker) act on the backend that started the stack.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

from deploy import container_stack, kafka, process_stack, spark_jars
from deploy.clients import s3_client
from deploy.endpoints import (
    BACKENDS,
    ENDPOINTS,
    Backend,
    BrokerEndpoint,
    ContainerNetwork,
    Endpoints,
    EtcdEndpoint,
    S3Endpoint,
)
from deploy.errors import StackError

__all__ = [
    "BACKENDS",
    "ENDPOINTS",
    "Backend",
    "BrokerEndpoint",
    "ContainerNetwork",
    "Endpoints",
    "EtcdEndpoint",
    "S3Endpoint",
    "components_alive",
    "fetch",
    "kill_broker",
    "pause_broker",
    "restart_broker",
    "s3_client",
    "start",
    "status",
    "stop",
    "unpause_broker",
]

_BACKENDS: dict[str, ModuleType] = {"processes": process_stack, "containers": container_stack}


def _backend(name: str) -> ModuleType:
    try:
        return _BACKENDS[name]
    except KeyError:
        raise StackError(f"unknown stack backend {name!r}: use one of {', '.join(BACKENDS)}") from None


def fetch() -> None:
    """Download and build what the processes backend runs (Kafka jars, MinIO) and the jars the Spark
    export adds to PySpark's (Delta, Spark's Kafka source), starting nothing."""
    process_stack.fetch()
    if importlib.util.find_spec("pyspark") is not None:  # installed with the [spark] extra
        spark_jars.fetch_jars()


def start(stack_dir: Path, brokers: int = 1, backend: Backend | None = None) -> Endpoints:
    """Start the stack in ``stack_dir`` (or return the running one's endpoints).

    ``backend`` defaults to the existing stack's, else ``processes``. A stopped stack starts again on
    its data (same cluster id, new ports). The number of brokers and the backend of an existing stack
    cannot change: that raises StackError.
    """
    stack_dir = Path(stack_dir).resolve()
    existing = stack_dir / ENDPOINTS
    if existing.exists():
        endpoints = Endpoints.load(existing)
        if len(endpoints.brokers) != brokers:
            raise StackError(
                f"the stack in {stack_dir} has {len(endpoints.brokers)} broker(s); to run {brokers}, "
                f"stop it (tiering dev down) and use another --dir or delete this one"
            )
        if backend is not None and backend != endpoints.backend:
            raise StackError(
                f"the stack in {stack_dir} runs on the {endpoints.backend} backend, not {backend}: "
                f"stop it (tiering dev down) and use another --dir or delete this one"
            )
        if all(components_alive(endpoints).values()):
            return endpoints
        backend = endpoints.backend
        stop(stack_dir)
    if brokers < 1:
        raise StackError(f"--brokers must be at least 1, not {brokers}")
    stack_dir.mkdir(parents=True, exist_ok=True)
    cluster_id = kafka.formatted_cluster_id(stack_dir / "kafka-1") or kafka.new_cluster_id()
    endpoints = _backend(backend or "processes").start(stack_dir, brokers, cluster_id)
    endpoints.save()
    return endpoints


def stop(stack_dir: Path) -> None:
    """Stop every component of the stack in ``stack_dir``; idempotent. Data stays on disk."""
    path = Path(stack_dir) / ENDPOINTS
    if path.exists():
        endpoints = Endpoints.load(path)
        _backend(endpoints.backend).stop(endpoints)


def components_alive(endpoints: Endpoints) -> dict[str, bool]:
    """``{"kafka-1": True, ..., "minio": ..., "etcd": ...}``: which components run (a paused one does)."""
    alive: dict[str, bool] = _backend(endpoints.backend).components_alive(endpoints)
    return alive


def status(stack_dir: Path) -> dict[str, object]:
    """The endpoints and which components are alive (``{"running": False}`` when there is no stack)."""
    path = Path(stack_dir) / ENDPOINTS
    if not path.exists():
        return {"running": False, "stack_dir": str(stack_dir)}
    endpoints = Endpoints.load(path)
    alive_map = components_alive(endpoints)
    return {
        "running": all(alive_map.values()),
        "backend": endpoints.backend,
        "alive": alive_map,
        **json.loads(endpoints.model_dump_json()),
    }


def kill_broker(endpoints: Endpoints, broker_id: int, *, hard: bool = True) -> None:
    """Stop one broker: SIGKILL when ``hard`` (a crash), SIGTERM otherwise (a controlled shutdown)."""
    _backend(endpoints.backend).kill_broker(endpoints, broker_id, hard=hard)


def restart_broker(endpoints: Endpoints, broker_id: int) -> Endpoints:
    """Start a stopped broker again on its data and wait until it serves; a running one is left alone.

    Updates ``endpoints`` in place (the new pid), saves it to endpoints.json and returns it.
    """
    restarted: Endpoints = _backend(endpoints.backend).restart_broker(endpoints, broker_id)
    return restarted


def pause_broker(endpoints: Endpoints, broker_id: int) -> None:
    """Freeze one broker (SIGSTOP its processes, or pause its container): alive, but answering nothing."""
    _backend(endpoints.backend).pause_broker(endpoints, broker_id)


def unpause_broker(endpoints: Endpoints, broker_id: int) -> None:
    """Let a paused broker run again; it finds out it lost its leaderships and catches up."""
    _backend(endpoints.backend).unpause_broker(endpoints, broker_id)
