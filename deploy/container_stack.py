"""The containers backend of the local stack: Kafka, MinIO and etcd (and sidecars beside the brokers)
in containers of the local images (``deploy.images``), started with testcontainers through podman's
Docker-compatible API (``deploy.podman``).

Layout, per stack directory: one container network; each container is named ``<prefix>-<role>``,
labelled with the stack directory, and known to the others by its role (``kafka-1``, ``minio``,
``etcd``). Only published ports reach the host, each on 127.0.0.1:

- a broker has three listeners: EXTERNAL on a free host port P, listening on P inside the container
  too and published 127.0.0.1:P -> P, so the address it advertises (127.0.0.1:P) is the one the host
  dials; INTERNAL (``kafka-N:9092``) for the other brokers and for sidecar containers; CONTROLLER
  (``kafka-N:9093``) for the KRaft voters.
- a broker's node directory (server.properties, server.log, ``data/`` = log.dirs) is a host directory
  mounted at /kafka, so the host reads its segments as with local processes; a sidecar container
  mounts the same ``data/`` read-only at /var/lib/kafka/data, as in deploy/k8s/.

``deploy.stack`` is the interface; it calls these functions for a stack whose endpoints have a
``containers`` section.
"""

from __future__ import annotations

import contextlib
import hashlib
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from deploy import etcd, images, kafka, minio, podman
from deploy.clients import broker_serving, ensure_bucket
from deploy.endpoints import BrokerEndpoint, ContainerNetwork, Endpoints, EtcdEndpoint
from deploy.errors import StackError, log_tail
from deploy.procs import free_port, wait_until
from tiering_core.logs import get_logger

log = get_logger(__name__)

LABEL = "io.github.kafka-tiering.stack"
INTERNAL_PORT, CONTROLLER_PORT = 9092, 9093
MINIO_PORT, ETCD_PORT, METRICS_PORT = 9000, 2379, 9464
SIDECAR_LOG_DIR, SIDECAR_CONFIG_DIR = "/var/lib/kafka/data", "/etc/tiering"


def _docker() -> Any:
    """A Docker SDK client on podman's API (testcontainers' client, so its settings apply)."""
    podman.ensure_service()
    # Imported here: testcontainers reads its settings from the environment at import time, and
    # ensure_service() has just set them.
    from testcontainers.core.docker_client import DockerClient

    return DockerClient(timeout=120).client


def prefix_for(stack_dir: Path) -> str:
    """``tiering-<hash of the stack dir>``: container and network names of one stack, unique per directory."""
    return "tiering-" + hashlib.sha256(str(Path(stack_dir).resolve()).encode()).hexdigest()[:10]


def start(stack_dir: Path, n: int, cluster_id: str) -> Endpoints:
    """Start every component in ``stack_dir`` (on its data, if any); whatever started is removed on failure."""
    client = _docker()
    tags = {b.name: b.tag for b in images.ensure_images(images.STACK_IMAGES, log=log.info).values()}
    prefix = prefix_for(stack_dir)
    _remove_all(client, stack_dir, prefix)  # what an interrupted earlier run of this directory left
    try:
        return _start_all(client, stack_dir, n, cluster_id, prefix, tags)
    except StackError:
        _remove_all(client, stack_dir, prefix)
        raise
    except Exception as exc:  # the engine's API errors: one error type for the callers
        _remove_all(client, stack_dir, prefix)
        raise StackError(f"the containers backend could not start the stack in {stack_dir}: {exc}") from exc
    except BaseException:
        _remove_all(client, stack_dir, prefix)
        raise


def _start_all(client: Any, stack_dir: Path, n: int, cluster_id: str, prefix: str, tags: dict[str, str]) -> Endpoints:
    from testcontainers.core.network import Network

    network = Network(docker_network_kw={"labels": {LABEL: str(stack_dir)}})
    network.name = prefix
    network.create()
    ports = {i: free_port() for i in range(1, n + 1)}
    voters = ",".join(f"{i}@kafka-{i}:{CONTROLLER_PORT}" for i in ports)
    brokers = []
    for i, port in ports.items():
        node_dir = stack_dir / f"kafka-{i}"
        listeners = {
            "controller.quorum.voters": voters,
            "listeners": f"EXTERNAL://0.0.0.0:{port},INTERNAL://0.0.0.0:{INTERNAL_PORT},"
            f"CONTROLLER://0.0.0.0:{CONTROLLER_PORT}",
            "advertised.listeners": f"EXTERNAL://127.0.0.1:{port},INTERNAL://kafka-{i}:{INTERNAL_PORT}",
            "inter.broker.listener.name": "INTERNAL",
            "listener.security.protocol.map": "EXTERNAL:PLAINTEXT,INTERNAL:PLAINTEXT,CONTROLLER:PLAINTEXT",
        }
        kafka.write_node_files(node_dir, kafka.node_properties(i, n, Path("/kafka"), listeners), Path("/kafka"))
        (node_dir / "data").mkdir(exist_ok=True)
        brokers.append(
            BrokerEndpoint(
                id=i, host_port=f"127.0.0.1:{port}", controller_port=CONTROLLER_PORT,
                log_dir=str(node_dir / "data"), node_dir=str(node_dir), container=f"{prefix}-kafka-{i}",
            )
        )  # fmt: skip
        _Container(tags["kafka"], f"{prefix}-kafka-{i}", f"kafka-{i}", network, stack_dir).with_envs(
            KAFKA_CLUSTER_ID=cluster_id, KAFKA_JVM_OPTS=" ".join(kafka.JVM_OPTS)
        ).with_volume_mapping(str(node_dir), "/kafka", "rw").with_publish(port, port).start()

    s3_port, etcd_port = free_port(), free_port()
    (stack_dir / "minio" / "data").mkdir(parents=True, exist_ok=True)
    _Container(tags["minio"], f"{prefix}-minio", "minio", network, stack_dir).with_envs(
        MINIO_ROOT_USER=minio.ACCESS_KEY, MINIO_ROOT_PASSWORD=minio.SECRET_KEY, MINIO_BROWSER="off",
        MINIO_UPDATE="off", MINIO_REGION=minio.REGION,
    ).with_command(["server", "/data", "--quiet", "--address", f":{MINIO_PORT}"]).with_volume_mapping(
        str(stack_dir / "minio" / "data"), "/data", "rw"
    ).with_publish(MINIO_PORT, s3_port).start()  # fmt: skip
    (stack_dir / "etcd" / "data").mkdir(parents=True, exist_ok=True)
    etcd_args = [
        "--name", "local", "--data-dir", "/data/member-data", "--logger", "zap", "--log-level", "warn",
        "--listen-client-urls", f"http://0.0.0.0:{ETCD_PORT}", "--advertise-client-urls", f"http://etcd:{ETCD_PORT}",
        "--listen-peer-urls", "http://127.0.0.1:2380", "--initial-advertise-peer-urls", "http://127.0.0.1:2380",
        "--initial-cluster", "local=http://127.0.0.1:2380",
    ]  # fmt: skip
    _Container(tags["etcd"], f"{prefix}-etcd", "etcd", network, stack_dir).with_command(etcd_args).with_volume_mapping(
        str(stack_dir / "etcd" / "data"), "/data", "rw"
    ).with_publish(ETCD_PORT, etcd_port).start()

    endpoints = Endpoints(
        stack_dir=str(stack_dir),
        cluster_id=cluster_id,
        bootstrap=",".join(b.host_port for b in brokers),
        brokers=brokers,
        s3=minio.s3_endpoint(s3_port, stack_dir / "minio"),
        etcd=EtcdEndpoint(url=f"http://127.0.0.1:{etcd_port}", data_dir=str(stack_dir / "etcd")),
        kafka_classpath=kafka.classpath(),
        java=kafka.java_binary(),
        containers=ContainerNetwork(
            network=prefix,
            minio=f"{prefix}-minio",
            etcd=f"{prefix}-etcd",
            bootstrap=",".join(f"kafka-{i}:{INTERNAL_PORT}" for i in ports),
            s3_endpoint_url=f"http://minio:{MINIO_PORT}",
            etcd_url=f"http://etcd:{ETCD_PORT}",
            images=tags,
            broker_hosts={i: f"kafka-{i}:{INTERNAL_PORT}" for i in ports},
        ),
    )
    _wait(client, f"{prefix}-minio", "minio", lambda: minio.minio_live(s3_port))
    ensure_bucket(endpoints)
    _wait(client, f"{prefix}-etcd", "etcd", lambda: etcd.etcd_healthy(etcd_port))
    for b in brokers:
        _wait_broker(client, b, n)
    return endpoints


class _Container:
    """testcontainers' DockerContainer with this stack's conventions: named, labelled with the stack
    directory, on the stack's network under an alias, ports published on 127.0.0.1 only."""

    def __init__(self, image: str, name: str, alias: str, network: Any, stack_dir: Path) -> None:
        from testcontainers.core.container import DockerContainer

        self.inner = DockerContainer(image).with_name(name).with_network(network).with_network_aliases(alias)
        self.inner.with_kwargs(labels={LABEL: str(stack_dir)})

    def with_envs(self, **env: str) -> _Container:
        self.inner.with_envs(**env)
        return self

    def with_command(self, command: list[str]) -> _Container:
        self.inner.with_command(command)
        return self

    def with_volume_mapping(self, host: str, inside: str, mode: str) -> _Container:
        self.inner.with_volume_mapping(host, inside, mode)
        return self

    def with_tmpfs(self, inside: str) -> _Container:
        self.inner.tmpfs[inside] = "mode=1777"
        return self

    def with_publish(self, inside: int, host_port: int) -> _Container:
        # A (host ip, port) pair reaches the Docker SDK as is: the port listens on 127.0.0.1 only.
        self.inner.ports[f"{inside}/tcp"] = ("127.0.0.1", host_port)  # type: ignore[assignment]
        return self

    def start(self) -> None:
        self.inner.start()


def container_logs(name: str, lines: int = 25) -> str:
    """The last ``lines`` lines a container wrote to stdout/stderr ('' when it is gone)."""
    with contextlib.suppress(Exception):
        return str(_docker().containers.get(name).logs(tail=lines).decode("utf-8", "replace"))
    return ""


def _state(client: Any, name: str) -> str:
    """The container's status (``running``, ``paused``, ``exited``...), ``missing`` when there is none."""
    found = client.containers.list(all=True, filters={"name": f"^{name}$"})
    return str(found[0].status) if found else "missing"


def _wait(client: Any, name: str, component: str, probe: Any, log_file: Path | None = None, timeout=90.0) -> None:
    def logs() -> str:
        return log_tail(log_file) if log_file is not None else container_logs(name)

    wait_until(
        f"{component} (container {name})", probe, lambda: _state(client, name) == "running",
        logs, str(log_file) if log_file else f"podman logs {name}", timeout,
    )  # fmt: skip


def _wait_broker(client: Any, broker: BrokerEndpoint, n: int) -> None:
    assert broker.container is not None
    server_log = Path(broker.node_dir) / "server.log"
    _wait(client, broker.container, f"kafka broker {broker.id}", lambda: broker_serving(broker, n), server_log, 180)


def _remove_all(client: Any, stack_dir: Path, prefix: str) -> None:
    """Remove the stack's containers (brokers first stopped cleanly, together) and its network; idempotent."""
    containers = client.containers.list(all=True, filters={"label": f"{LABEL}={stack_dir}"})

    def stop(container: Any) -> None:
        with contextlib.suppress(Exception):
            if container.status == "paused":
                container.unpause()
            container.stop(timeout=30)
        with contextlib.suppress(Exception):
            container.remove(force=True)

    with ThreadPoolExecutor(max_workers=max(1, len(containers))) as pool:
        list(pool.map(stop, containers))
    for network in client.networks.list(names=[prefix]):
        with contextlib.suppress(Exception):
            network.remove()


def stop(endpoints: Endpoints) -> None:
    """Remove every container of the stack (sidecars too) and its network; idempotent. Data stays on disk."""
    stack_dir = Path(endpoints.stack_dir)
    _remove_all(_docker(), stack_dir, prefix_for(stack_dir))


def components_alive(endpoints: Endpoints) -> dict[str, bool]:
    assert endpoints.containers is not None
    client = _docker()

    def up(name: str | None) -> bool:
        return name is not None and _state(client, name) in ("running", "paused")

    status = {f"kafka-{b.id}": up(b.container) for b in endpoints.brokers}
    status["minio"] = up(endpoints.containers.minio)
    status["etcd"] = up(endpoints.containers.etcd)
    return status


def _broker_container(endpoints: Endpoints, broker_id: int) -> Any:
    name = endpoints.broker(broker_id).container
    return _docker().containers.get(name)


def kill_broker(endpoints: Endpoints, broker_id: int, *, hard: bool) -> None:
    """SIGKILL the broker's container (``hard``), or stop it (SIGTERM: a controlled shutdown; 60 s)."""
    container = _broker_container(endpoints, broker_id)
    if container.status == "paused":
        container.unpause()
    if hard:
        container.kill()
    else:
        container.stop(timeout=60)
    container.wait(timeout=90)


def restart_broker(endpoints: Endpoints, broker_id: int) -> Endpoints:
    """Start the stopped container again (same ports, same data) and wait until the broker serves."""
    container = _broker_container(endpoints, broker_id)
    container.reload()
    if container.status in ("running", "paused"):
        return endpoints
    container.start()
    _wait_broker(_docker(), endpoints.broker(broker_id), len(endpoints.brokers))
    endpoints.save()
    return endpoints


def pause_broker(endpoints: Endpoints, broker_id: int) -> None:
    """Freeze every process of the broker's container (cgroup freezer): alive, but answering nothing."""
    _broker_container(endpoints, broker_id).pause()


def unpause_broker(endpoints: Endpoints, broker_id: int) -> None:
    """Let a paused broker's container run again; idempotent."""
    container = _broker_container(endpoints, broker_id)
    if container.status == "paused":
        container.unpause()


@dataclass(frozen=True)
class SidecarContainer:
    """A sidecar running in a container beside broker ``broker_id``, its /metrics published on the host."""

    name: str
    broker_id: int
    metrics_url: str


def sidecar_config(endpoints: Endpoints, broker_id: int, **overrides: Any) -> dict[str, Any]:
    """A sidecar configuration as seen from inside the stack's network: the broker's internal listener,
    its log dir where the container mounts it, MinIO by its network name, /metrics on all interfaces."""
    net = endpoints.containers
    if net is None:
        raise StackError(f"the stack in {endpoints.stack_dir} runs local processes: sidecar containers need "
                         f"the containers backend (TIERING_TEST_BACKEND=containers)")  # fmt: skip
    config: dict[str, Any] = {
        "bootstrap_servers": net.broker_address(broker_id),
        "log_dirs": [SIDECAR_LOG_DIR],
        "state_dir": "/var/lib/tiering",
        "remote_storage": {
            "kind": "s3", "bucket": endpoints.s3.bucket, "endpoint_url": net.s3_endpoint_url,
            "region": endpoints.s3.region, "path_style": True,
            "access_key_id": endpoints.s3.access_key, "secret_access_key": endpoints.s3.secret_key,
        },
        "metrics_port": METRICS_PORT,
        "metrics_host": "0.0.0.0",
    }  # fmt: skip
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(config.get(key), dict):
            config[key] = {**config[key], **value}
        else:
            config[key] = value
    return config


def start_sidecar(endpoints: Endpoints, broker_id: int, config: dict[str, Any]) -> SidecarContainer:
    """Run ``tiering sidecar run`` in a container of the sidecar image beside broker ``broker_id``: the
    broker's log dir mounted read-only, ``config`` (see ``sidecar_config``) mounted at /etc/tiering, its
    state on a tmpfs. Returns once its /metrics answers; StackError with its output if it exits."""
    from testcontainers.core.network import Network

    assert endpoints.containers is not None
    client = _docker()
    tag = images.ensure_images(("sidecar",), log=log.info)["sidecar"].tag
    stack_dir = Path(endpoints.stack_dir)
    name = f"{prefix_for(stack_dir)}-sidecar-{broker_id}"
    with contextlib.suppress(Exception):
        client.containers.get(name).remove(force=True)
    config_dir = stack_dir / f"sidecar-{broker_id}"
    config_dir.mkdir(parents=True, exist_ok=True)
    (config_dir / "sidecar.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    network = Network()
    network.name = endpoints.containers.network
    port = free_port()
    container = _Container(tag, name, f"sidecar-{broker_id}", network, stack_dir)
    container.with_command(["sidecar", "run", "--config", f"{SIDECAR_CONFIG_DIR}/sidecar.yaml"])
    container.with_volume_mapping(endpoints.broker(broker_id).log_dir, SIDECAR_LOG_DIR, "ro")
    container.with_volume_mapping(str(config_dir), SIDECAR_CONFIG_DIR, "ro").with_tmpfs("/var/lib/tiering")
    container.with_publish(METRICS_PORT, port).start()
    sidecar = SidecarContainer(name, broker_id, f"http://127.0.0.1:{port}/metrics")

    def serving() -> bool:
        with urllib.request.urlopen(sidecar.metrics_url, timeout=2) as response:
            return bool(response.status == 200)

    _wait(client, name, f"sidecar beside broker {broker_id}", serving, timeout=120)
    return sidecar


def stop_sidecar(sidecar: SidecarContainer, timeout: float = 60) -> int:
    """Stop the sidecar (SIGTERM, then SIGKILL after ``timeout``; a paused one is let run first) and
    return its exit code. The container stays, with its logs, until ``remove_sidecar``."""
    container = _docker().containers.get(sidecar.name)
    if container.status == "paused":
        container.unpause()
    container.stop(timeout=int(timeout))
    return int(container.wait(timeout=timeout + 30)["StatusCode"])


def remove_sidecar(sidecar: SidecarContainer) -> str:
    """Stop (if running) and remove the sidecar's container; returns everything it logged."""
    stop_sidecar(sidecar)
    container = _docker().containers.get(sidecar.name)
    output = str(container.logs().decode("utf-8", "replace"))
    container.remove(force=True)
    return output


def pause_sidecar(sidecar: SidecarContainer) -> None:
    """Freeze the sidecar's container, as ``pause_broker`` does a broker's (a stalled node: both at once)."""
    _docker().containers.get(sidecar.name).pause()


def unpause_sidecar(sidecar: SidecarContainer) -> None:
    _docker().containers.get(sidecar.name).unpause()
