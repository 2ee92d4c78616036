"""The processes backend of the local stack: Kafka (KRaft, 1 or 3 combined nodes), MinIO and etcd as
local processes on 127.0.0.1, each in its own process group, with its pid in ``endpoints.json``.

``deploy.stack`` is the interface; it calls these functions for a stack whose endpoints have no
``containers`` section.
"""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

from deploy import etcd, kafka, minio
from deploy.clients import broker_serving, ensure_bucket
from deploy.endpoints import BrokerEndpoint, Endpoints, EtcdEndpoint
from deploy.procs import alive, free_port, stop_groups, wait_ready


def fetch() -> None:
    """Download and build what the stack runs (Kafka jars, MinIO), starting nothing."""
    kafka.fetch_jars()
    minio.build_minio()
    etcd.etcd_binary()


def start(stack_dir: Path, brokers: int, cluster_id: str) -> Endpoints:
    """Start every component in ``stack_dir`` (on its data, if any); whatever started is killed on failure."""
    fetch()
    started: list[int] = []
    try:
        return _start_all(stack_dir, brokers, cluster_id, started)
    except BaseException:
        stop_groups(started, kill=True)
        raise


def _start_all(stack_dir: Path, n: int, cluster_id: str, started: list[int]) -> Endpoints:
    nodes = [kafka.NodePorts(i, free_port(), free_port()) for i in range(1, n + 1)]
    broker_eps = []
    for node in nodes:
        node_dir = stack_dir / f"kafka-{node.node_id}"
        kafka.write_node_config(node_dir, node, nodes)
        kafka.format_storage(node_dir, cluster_id)
        broker_eps.append(
            BrokerEndpoint(
                id=node.node_id,
                host_port=f"127.0.0.1:{node.broker_port}",
                controller_port=node.controller_port,
                log_dir=str(node_dir / "data"),
                node_dir=str(node_dir),
            )
        )
    for b in broker_eps:
        b.pid = kafka.start_node(Path(b.node_dir))
        started.append(b.pid)

    s3_port, console_port = free_port(), free_port()
    minio_dir = stack_dir / "minio"
    s3_pid = minio.start_minio(minio_dir, s3_port, console_port)
    started.append(s3_pid)
    etcd_port, peer_port = free_port(), free_port()
    etcd_pid = etcd.start_etcd(stack_dir / "etcd", etcd_port, peer_port)
    started.append(etcd_pid)

    endpoints = Endpoints(
        stack_dir=str(stack_dir),
        cluster_id=cluster_id,
        bootstrap=",".join(b.host_port for b in broker_eps),
        brokers=broker_eps,
        s3=minio.s3_endpoint(s3_port, minio_dir, pid=s3_pid),
        etcd=EtcdEndpoint(url=f"http://127.0.0.1:{etcd_port}", data_dir=str(stack_dir / "etcd"), pid=etcd_pid),
        kafka_classpath=kafka.classpath(),
        java=kafka.java_binary(),
    )
    wait_ready("minio", s3_pid, lambda: minio.minio_live(s3_port), minio_dir / "minio.log")
    ensure_bucket(endpoints)
    wait_ready("etcd", etcd_pid, lambda: etcd.etcd_healthy(etcd_port), stack_dir / "etcd" / "etcd.log")
    for b in broker_eps:
        _wait_broker(b, n)
    return endpoints


def _wait_broker(broker: BrokerEndpoint, n: int) -> None:
    assert broker.pid is not None
    wait_ready(
        f"kafka broker {broker.id}",
        broker.pid,
        lambda: broker_serving(broker, n),
        Path(broker.node_dir) / "server.log",
        timeout=120,
    )


def stop(endpoints: Endpoints) -> None:
    """Stop every process of the stack (paused ones too); idempotent. Data stays on disk."""
    for b in endpoints.brokers:
        _signal_group(b.pid, signal.SIGCONT)
    stop_groups([b.pid for b in endpoints.brokers], timeout=30)
    stop_groups([endpoints.s3.pid, endpoints.etcd.pid])


def components_alive(endpoints: Endpoints) -> dict[str, bool]:
    status = {f"kafka-{b.id}": alive(b.pid) for b in endpoints.brokers}
    status["minio"] = alive(endpoints.s3.pid)
    status["etcd"] = alive(endpoints.etcd.pid)
    return status


def kill_broker(endpoints: Endpoints, broker_id: int, *, hard: bool) -> None:
    b = endpoints.broker(broker_id)
    _signal_group(b.pid, signal.SIGCONT)  # a paused broker cannot shut down
    stop_groups([b.pid], kill=hard, timeout=60)


def restart_broker(endpoints: Endpoints, broker_id: int) -> Endpoints:
    b = endpoints.broker(broker_id)
    if alive(b.pid):
        return endpoints
    b.pid = kafka.start_node(Path(b.node_dir))
    endpoints.save()
    _wait_broker(b, len(endpoints.brokers))
    return endpoints


def pause_broker(endpoints: Endpoints, broker_id: int) -> None:
    """SIGSTOP the broker's process group: it holds its sockets and files but answers nothing."""
    _signal_group(endpoints.broker(broker_id).pid, signal.SIGSTOP)


def unpause_broker(endpoints: Endpoints, broker_id: int) -> None:
    _signal_group(endpoints.broker(broker_id).pid, signal.SIGCONT)


def _signal_group(pid: int | None, sig: signal.Signals) -> None:
    if pid and alive(pid):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, sig)
