"""Kroxylicious, the Kafka community's proxy, run from its Maven Central jars with no filters: the reference proxy
of ``tiering bench proxy``, so that what our proxy costs a consumer is measured beside what a proxy that only
forwards frames costs on the same machine, in the same run.

Its runtime jar and dependencies are fetched once into the cache (``deploy/kroxylicious-pom.xml``);
``deploy/LoopbackKroxylicious.java`` starts it through Java's source launcher (a JDK, not only a JRE) on
127.0.0.1 only. The gateway is Kroxylicious' ``portIdentifiesNode``: a bootstrap port, then one port per node,
in the order of the node ids, from ``nodeStartPort``."""

from __future__ import annotations

import socket
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import yaml

from deploy.errors import StackError
from deploy.kafka import java_binary
from deploy.maven import fetch_pom
from deploy.procs import free_port, spawn, stop_groups, wait_ready
from tiering_core.cache import cache_dir

KROXYLICIOUS_VERSION = "0.12.0"  # as in the pom
POM = Path(__file__).with_name("kroxylicious-pom.xml")
LAUNCHER = Path(__file__).with_name("LoopbackKroxylicious.java")
JVM_OPTS = ["-Xms256m", "-Xmx1g", "-Djava.awt.headless=true", "-XX:+ExitOnOutOfMemoryError"]


def jars_dir() -> Path:
    return cache_dir() / f"kroxylicious-{KROXYLICIOUS_VERSION}"


def fetch_jars() -> Path:
    """Download Kroxylicious' jars into the cache once (idempotent); return the directory."""
    return fetch_pom(POM, jars_dir(), f"Kroxylicious {KROXYLICIOUS_VERSION}'s jars")


@dataclass(frozen=True)
class Kroxylicious:
    port: int
    pid: int

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def stop(self) -> None:
        stop_groups([self.pid])


def start_kroxylicious(directory: Path, upstream: str, node_ids: list[int]) -> Kroxylicious:
    """Kroxylicious in front of the cluster whose bootstrap is ``upstream``, its configuration and log in
    ``directory`` (created). Raises StackError naming its log when it does not start."""
    jars = fetch_jars()
    directory.mkdir(parents=True, exist_ok=True)
    port, nodes_from = free_port(), _free_block(len(node_ids))
    config = directory / "kroxylicious.yaml"
    gateway = {"bootstrapAddress": f"127.0.0.1:{port}", "nodeStartPort": nodes_from,
               "nodeIdRanges": [{"name": f"node-{n}", "start": n, "end": n} for n in sorted(node_ids)]}  # fmt: skip
    config.write_text(yaml.safe_dump({"virtualClusters": [{
        "name": "reference", "targetCluster": {"bootstrapServers": upstream},
        "gateways": [{"name": "loopback", "portIdentifiesNode": gateway}],
    }]}))  # fmt: skip
    log = directory / "kroxylicious.log"
    pid = spawn([java_binary(), *JVM_OPTS, "-cp", f"{jars}/*", str(LAUNCHER), str(config)], log, cwd=directory)
    proxy = Kroxylicious(port, pid)
    try:
        wait_ready("Kroxylicious", pid, lambda: _listening(port), log, timeout=120)
    except StackError:
        proxy.stop()
        raise
    return proxy


def _free_block(n: int) -> int:
    """The first of ``n`` consecutive TCP ports of 127.0.0.1 that are free right now."""
    for _ in range(50):
        first = free_port()
        with ExitStack() as held:
            try:
                for port in range(first, first + n):
                    s = held.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
                    s.bind(("127.0.0.1", port))
            except OSError:
                continue
        return first
    raise StackError(f"no {n} consecutive free ports on 127.0.0.1 for Kroxylicious' nodes")


def _listening(port: int) -> bool:
    with socket.create_connection(("127.0.0.1", port), 1):
        return True
