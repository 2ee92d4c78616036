"""The local stack: Kafka (KRaft, 1 or 3 combined nodes), MinIO and etcd, as local processes.

``start(stack_dir)`` brings everything up and writes ``<stack_dir>/endpoints.json``, the one file
the CLI, the demo, the benchmarks and the tests read. It is idempotent: on a running stack it returns
the recorded endpoints. ``stop`` is idempotent too. Processes run in their own process groups.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import boto3
from botocore.config import Config
from confluent_kafka.admin import AdminClient
from pydantic import BaseModel

from deploy import etcd, kafka, minio
from deploy.errors import StackError
from deploy.procs import alive, free_port, stop_groups, wait_ready

ENDPOINTS = "endpoints.json"


class BrokerEndpoint(BaseModel):
    id: int
    host_port: str
    controller_port: int
    log_dir: str
    node_dir: str
    pid: int | None = None


class S3Endpoint(BaseModel):
    endpoint_url: str
    access_key: str
    secret_key: str
    region: str
    bucket: str
    data_dir: str
    pid: int | None = None


class EtcdEndpoint(BaseModel):
    url: str
    data_dir: str
    pid: int | None = None


class Endpoints(BaseModel):
    """Where every component of a running local stack listens, and its pid."""

    stack_dir: str
    cluster_id: str
    bootstrap: str
    brokers: list[BrokerEndpoint]
    s3: S3Endpoint
    etcd: EtcdEndpoint
    kafka_classpath: str
    java: str

    @classmethod
    def load(cls, path: Path) -> Endpoints:
        try:
            return cls.model_validate_json(path.read_text())
        except FileNotFoundError as exc:
            raise StackError(f"no local stack at {path.parent}: run `tiering dev up` first") from exc

    def save(self) -> None:
        path = Path(self.stack_dir) / ENDPOINTS
        tmp = path.with_suffix(".tmp")
        tmp.write_text(self.model_dump_json(indent=2))
        tmp.replace(path)

    def broker(self, broker_id: int) -> BrokerEndpoint:
        for b in self.brokers:
            if b.id == broker_id:
                return b
        raise StackError(f"no broker {broker_id} in the stack at {self.stack_dir}")

    def components_alive(self) -> dict[str, bool]:
        status = {f"kafka-{b.id}": alive(b.pid) for b in self.brokers}
        status["minio"] = alive(self.s3.pid)
        status["etcd"] = alive(self.etcd.pid)
        return status


def fetch() -> None:
    """Download and build what the stack runs (Kafka jars, MinIO), starting nothing."""
    kafka.fetch_jars()
    minio.build_minio()
    etcd.etcd_binary()


def start(stack_dir: Path, brokers: int = 1) -> Endpoints:
    """Start the stack in ``stack_dir`` (or return the running one's endpoints).

    A stopped stack starts again on its data (same cluster id, new ports). The number of brokers of
    an existing stack cannot change: that raises StackError.
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
        if all(endpoints.components_alive().values()):
            return endpoints
        stop(stack_dir)
    if brokers < 1:
        raise StackError(f"--brokers must be at least 1, not {brokers}")
    stack_dir.mkdir(parents=True, exist_ok=True)
    fetch()
    cluster_id = kafka.formatted_cluster_id(stack_dir / "kafka-1") or kafka.new_cluster_id()
    started: list[int] = []
    try:
        endpoints = _start_all(stack_dir, brokers, cluster_id, started)
    except BaseException:
        stop_groups(started, kill=True)
        raise
    endpoints.save()
    return endpoints


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
        s3=S3Endpoint(
            endpoint_url=f"http://127.0.0.1:{s3_port}",
            access_key=minio.ACCESS_KEY,
            secret_key=minio.SECRET_KEY,
            region=minio.REGION,
            bucket="tiering",
            data_dir=str(minio_dir),
            pid=s3_pid,
        ),
        etcd=EtcdEndpoint(url=f"http://127.0.0.1:{etcd_port}", data_dir=str(stack_dir / "etcd"), pid=etcd_pid),
        kafka_classpath=kafka.classpath(),
        java=kafka.java_binary(),
    )
    wait_ready("minio", s3_pid, lambda: minio.minio_live(s3_port), minio_dir / "minio.log")
    _ensure_bucket(endpoints)
    wait_ready("etcd", etcd_pid, lambda: etcd.etcd_healthy(etcd_port), stack_dir / "etcd" / "etcd.log")
    for b in broker_eps:
        _wait_broker(b, n)
    return endpoints


def s3_client(endpoints: Endpoints) -> Any:
    """A boto3 S3 client for the stack's MinIO (path-style addressing)."""
    return boto3.client(
        "s3",
        endpoint_url=endpoints.s3.endpoint_url,
        aws_access_key_id=endpoints.s3.access_key,
        aws_secret_access_key=endpoints.s3.secret_key,
        region_name=endpoints.s3.region,
        config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 3}),
    )


def _ensure_bucket(endpoints: Endpoints) -> None:
    client = s3_client(endpoints)
    existing = {b["Name"] for b in client.list_buckets().get("Buckets", [])}
    if endpoints.s3.bucket not in existing:
        client.create_bucket(Bucket=endpoints.s3.bucket)


def _broker_serving(broker: BrokerEndpoint, n: int) -> bool:
    """True when ``broker`` itself answers a metadata request listing all ``n`` brokers.

    Asking the broker itself (not the cluster) matters after a restart: the cluster keeps listing a
    killed broker until its session times out, so a cluster-wide count can be stale.
    """
    admin = AdminClient({"bootstrap.servers": broker.host_port, "socket.timeout.ms": 2000, "log_level": 0})
    metadata = admin.list_topics(timeout=3)
    return metadata.orig_broker_id == broker.id and len(metadata.brokers) >= n


def _wait_broker(broker: BrokerEndpoint, n: int) -> None:
    assert broker.pid is not None
    wait_ready(
        f"kafka broker {broker.id}",
        broker.pid,
        lambda: _broker_serving(broker, n),
        Path(broker.node_dir) / "server.log",
        timeout=120,
    )


def stop(stack_dir: Path) -> None:
    """Stop every component of the stack in ``stack_dir``; idempotent. Data stays on disk."""
    path = Path(stack_dir) / ENDPOINTS
    if not path.exists():
        return
    endpoints = Endpoints.load(path)
    stop_groups([b.pid for b in endpoints.brokers], timeout=30)
    stop_groups([endpoints.s3.pid, endpoints.etcd.pid])


def status(stack_dir: Path) -> dict[str, object]:
    """The endpoints and which components are alive (``{"running": False}`` when there is no stack)."""
    path = Path(stack_dir) / ENDPOINTS
    if not path.exists():
        return {"running": False, "stack_dir": str(stack_dir)}
    endpoints = Endpoints.load(path)
    alive_map = endpoints.components_alive()
    return {"running": all(alive_map.values()), "alive": alive_map, **json.loads(endpoints.model_dump_json())}


def kill_broker(endpoints: Endpoints, broker_id: int, *, hard: bool = True) -> None:
    """Stop one broker: SIGKILL when ``hard`` (a crash), SIGTERM otherwise (a controlled shutdown)."""
    stop_groups([endpoints.broker(broker_id).pid], kill=hard, timeout=60)


def restart_broker(endpoints: Endpoints, broker_id: int) -> Endpoints:
    """Start a stopped broker again on its data and wait until it serves; a running one is left alone.

    Updates ``endpoints`` in place (the new pid), saves it to endpoints.json and returns it.
    """
    b = endpoints.broker(broker_id)
    if alive(b.pid):
        return endpoints
    b.pid = kafka.start_node(Path(b.node_dir))
    endpoints.save()
    _wait_broker(b, len(endpoints.brokers))
    return endpoints
