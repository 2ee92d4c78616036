"""Where the components of a running stack listen: the ``endpoints.json`` model, for both backends.

Every address here is reachable from the host (127.0.0.1). A stack run by the containers backend
also records, in ``containers``, its container names and the addresses the components have for each
other inside their network (what a sidecar container uses).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel

from deploy.errors import StackError

ENDPOINTS = "endpoints.json"
Backend = Literal["processes", "containers"]
BACKENDS: tuple[Backend, ...] = ("processes", "containers")


class BrokerEndpoint(BaseModel):
    id: int
    host_port: str
    controller_port: int
    log_dir: str
    node_dir: str
    pid: int | None = None
    container: str | None = None


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


class ContainerNetwork(BaseModel):
    """The containers backend's view from inside its network (absent for local processes)."""

    network: str
    minio: str
    etcd: str
    bootstrap: str
    s3_endpoint_url: str
    etcd_url: str
    images: dict[str, str]
    broker_hosts: dict[int, str]

    def broker_address(self, broker_id: int) -> str:
        """``host:port`` of the broker's listener inside the network (what its sidecar bootstraps from)."""
        try:
            return self.broker_hosts[broker_id]
        except KeyError:
            raise StackError(f"no broker {broker_id} in the container network {self.network}") from None


class Endpoints(BaseModel):
    """Where every component of a running stack listens, and its pid or container."""

    stack_dir: str
    cluster_id: str
    bootstrap: str
    brokers: list[BrokerEndpoint]
    s3: S3Endpoint
    etcd: EtcdEndpoint
    kafka_classpath: str
    java: str
    containers: ContainerNetwork | None = None

    @property
    def backend(self) -> Backend:
        return "processes" if self.containers is None else "containers"

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
