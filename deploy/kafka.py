"""Apache Kafka from its Maven Central jars: fetch once, format storage, run KRaft combined nodes.

Each node is ``process.roles=broker,controller`` with a static voter set (``controller.quorum.voters``),
so formatting needs only the cluster id. Settings are tuned for a local stack: fast retention checks,
no rebalance delay, replication factors capped at the number of nodes.
"""

from __future__ import annotations

import base64
import shutil
import subprocess
import uuid
from dataclasses import dataclass
from pathlib import Path

from deploy.errors import StackError
from deploy.maven import fetch_pom
from deploy.procs import spawn
from tiering_core.cache import cache_dir

KAFKA_VERSION = "4.3.1"
POM = Path(__file__).with_name("kafka-pom.xml")
JVM_OPTS = ["-Xms256m", "-Xmx768m", "-XX:+UseG1GC", "-Djava.awt.headless=true", "-XX:+ExitOnOutOfMemoryError"]


def java_binary() -> str:
    java = shutil.which("java")
    if java is None:
        raise StackError("java not found on PATH: install a Java 17+ runtime (e.g. apt-get install openjdk-17-jre)")
    return java


def jars_dir() -> Path:
    return cache_dir() / f"kafka-{KAFKA_VERSION}"


def fetch_jars() -> Path:
    """Download Kafka's jars (and their dependencies) into the cache once; return the directory.

    Idempotent: a complete earlier fetch (marked by ``.complete``) is reused.
    """
    return fetch_pom(POM, jars_dir(), f"Kafka {KAFKA_VERSION} jars")


def classpath() -> str:
    return str(fetch_jars() / "*")


def new_cluster_id() -> str:
    """A Kafka cluster id: a random UUID in URL-safe base64 without padding (22 characters). Like Kafka's
    ``Uuid.randomUuid`` it never starts with '-': kafka-storage's argument parser takes ``-t -x...`` for a
    missing value (1 start in 64 failed with "argument --cluster-id/-t: expected one argument")."""
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not text.startswith("-"):
            return text


@dataclass(frozen=True)
class NodePorts:
    node_id: int
    broker_port: int
    controller_port: int


LOG4J2 = """\
status = warn
appender.file.type = File
appender.file.name = file
appender.file.fileName = {log}
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.file.ref = file
logger.kafka.name = kafka
logger.kafka.level = INFO
logger.apache.name = org.apache.kafka
logger.apache.level = INFO
logger.zk.name = state.change.logger
logger.zk.level = WARN
"""


def write_node_config(node_dir: Path, node: NodePorts, voters: list[NodePorts]) -> Path:
    """Write server.properties and log4j2.properties for one combined node; return the properties path."""
    quorum = ",".join(f"{v.node_id}@127.0.0.1:{v.controller_port}" for v in voters)
    listeners = {
        "controller.quorum.voters": quorum,
        "listeners": f"PLAINTEXT://127.0.0.1:{node.broker_port},CONTROLLER://127.0.0.1:{node.controller_port}",
        "advertised.listeners": f"PLAINTEXT://127.0.0.1:{node.broker_port}",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
    }
    return write_node_files(node_dir, node_properties(node.node_id, len(voters), node_dir, listeners), node_dir)


def node_properties(node_id: int, n: int, node_dir: Path, listeners: dict[str, str]) -> dict[str, object]:
    """A combined node's settings, tuned for a local stack; ``listeners`` adds where it listens and its
    voters. ``node_dir`` is the node's directory as the broker sees it (its log dir is ``data/`` in it)."""
    rf = min(3, n)
    return {
        "process.roles": "broker,controller",
        "node.id": node_id,
        "controller.listener.names": "CONTROLLER",
        **listeners,
        "log.dirs": str(node_dir / "data"),
        "num.partitions": 1,
        "default.replication.factor": 1,
        "offsets.topic.replication.factor": rf,
        "offsets.topic.num.partitions": 5,
        "transaction.state.log.replication.factor": rf,
        "transaction.state.log.min.isr": min(2, n),
        "transaction.state.log.num.partitions": 5,
        "group.initial.rebalance.delay.ms": 0,
        "auto.create.topics.enable": "false",
        "log.retention.check.interval.ms": 1000,
        "log.initial.task.delay.ms": 1000,
        "log.segment.delete.delay.ms": 1000,
        "num.network.threads": 2,
        "num.io.threads": 4,
        "log.flush.offset.checkpoint.interval.ms": 5000,
    }


def write_node_files(node_dir: Path, props: dict[str, object], seen_as: Path) -> Path:
    """Write ``props`` as server.properties, and log4j2.properties logging to ``<seen_as>/server.log``,
    into ``node_dir`` (which the broker sees as ``seen_as``); return the properties path."""
    node_dir.mkdir(parents=True, exist_ok=True)
    path = node_dir / "server.properties"
    path.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
    (node_dir / "log4j2.properties").write_text(LOG4J2.format(log=seen_as / "server.log"))
    return path


def _java_cmd(node_dir: Path | None, main_class: str, *args: str) -> list[str]:
    opts = list(JVM_OPTS)
    if node_dir is not None:
        opts.append(f"-Dlog4j2.configurationFile=file:{node_dir / 'log4j2.properties'}")
        opts.append(f"-Dkafka.logs.dir={node_dir}")
    return [java_binary(), *opts, "-cp", classpath(), main_class, *args]


def formatted_cluster_id(node_dir: Path) -> str | None:
    """The cluster id in the node's ``meta.properties``, or None if its storage is not formatted."""
    meta = node_dir / "data" / "meta.properties"
    if not meta.exists():
        return None
    for line in meta.read_text().splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "cluster.id":
            return value.strip()
    raise StackError(f"{meta} has no cluster.id: delete {node_dir.parent} and start again")


def format_storage(node_dir: Path, cluster_id: str) -> None:
    """Format the node's log dir for KRaft (``kafka.tools.StorageTool format``); idempotent."""
    if (node_dir / "data" / "meta.properties").exists():
        return
    cmd = _java_cmd(
        node_dir,
        "kafka.tools.StorageTool",
        "format",
        "-t",
        cluster_id,
        "-c",
        str(node_dir / "server.properties"),
    )
    result = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise StackError(f"formatting Kafka storage in {node_dir} failed:\n{(result.stdout + result.stderr)[-3000:]}")


def start_node(node_dir: Path) -> int:
    """Start ``kafka.Kafka`` for the node configured in ``node_dir``; returns its pid."""
    cmd = _java_cmd(node_dir, "kafka.Kafka", str(node_dir / "server.properties"))
    return spawn(cmd, node_dir / "stdout.log")


def run_kafka_tool(main_class: str, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """Run one of Kafka's Java tools (``org.apache.kafka.tools.DumpLogSegments``...) on the stack's jars."""
    cmd = [java_binary(), "-Xmx512m", "-Dlog4j2.level=WARN", "-cp", classpath(), main_class, *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
