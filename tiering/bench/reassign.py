"""``tiering bench reassign``: what moving a partition to another broker costs, tiered beside untiered.

The same records go to two single-replica topics on the first broker: one tiered by the sidecar with a
local retention of about 1 % of the data (the broker deleted the rest after it was copied), one not
tiered. Each is then moved to the second broker with Kafka's own ``kafka-reassign-partitions`` (the
admin API's AlterPartitionReassignments), and the bench reports how long each move took (from the
first metadata answer showing the new replica until it is the only one, in sync and leading; the tool's
JVM start is reported apart) and how many bytes the new replica received (its partition directory's
segment files once the move is done). The new replica fetches from the leader's log start offset, which
local retention moved past everything tiered, so a tiered partition's move copies about its local share.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import click
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from deploy.bench_stack import bench_stack, stack_dir_option
from deploy.kafka import run_kafka_tool
from deploy.sidecar_config import write_sidecar_config
from deploy.stack import Endpoints
from tiering.cli.main import main as tiering_main
from tiering.sidecar.inprocess import tier_until
from tiering_core.errors import TieringError
from tiering_core.formats import list_segments
from tiering_core.kafka_logs import admin_client
from tiering_core.produce import produce_waiting

REASSIGN_TOOL = "org.apache.kafka.tools.reassign.ReassignPartitionsCommand"


class ReassignmentError(TieringError):
    """Kafka refused a reassignment, or it did not complete in time."""


def execute_reassignment(bootstrap: str, targets: dict[tuple[str, int], list[int]]) -> None:
    """Start moving each (topic, partition) to its target replicas with ``kafka-reassign-partitions --execute``
    (``--additional``: the tool refuses to start while another reassignment runs in the cluster, anyone's)."""
    plan = {"version": 1, "partitions": [{"topic": t, "partition": p, "replicas": r} for (t, p), r in targets.items()]}
    with tempfile.NamedTemporaryFile("w", suffix=".json", prefix="reassign-") as f:
        json.dump(plan, f)
        f.flush()
        result = run_kafka_tool(REASSIGN_TOOL, "--bootstrap-server", bootstrap, "--reassignment-json-file", f.name,
                                "--execute", "--additional")  # fmt: skip
    if result.returncode != 0 or "Successfully started" not in result.stdout:
        raise ReassignmentError(f"kafka-reassign-partitions --execute {plan} failed (exit {result.returncode}):\n"
                                f"{(result.stdout + result.stderr)[-3000:]}")  # fmt: skip


def replica_sets(admin: AdminClient, partitions: Iterable[tuple[str, int]]) -> dict[tuple[str, int], tuple]:
    """Each partition's (replicas, in-sync replicas as a set, leader) as Kafka answers now."""
    metadata = admin.list_topics(timeout=30)
    out: dict[tuple[str, int], tuple] = {}
    for topic, partition in partitions:
        found = metadata.topics.get(topic)
        p = None if found is None else found.partitions.get(partition)
        out[(topic, partition)] = (None, None, None) if p is None else (list(p.replicas), set(p.isrs), p.leader)
    return out


def is_done(replicas: list[int] | None, isr: set[int] | None, leader: int | None, target: list[int]) -> bool:
    """Whether a partition has exactly its target replicas, all in sync, one of them leading. While a
    reassignment runs Kafka lists the union of the old and new replicas (an expansion's target at once),
    so the in-sync set and the leader decide, not the replica list alone."""
    return replicas == target and isr == set(target) and leader in target


@dataclass
class Reassignment:
    """How long a reassignment took: ``seconds`` from the first answer in which Kafka shows the partitions'
    replicas changing until the last is done (what Kafka spends moving data and leadership), ``tool_seconds``
    from starting ``kafka-reassign-partitions`` (a JVM: tens of seconds on a loaded machine) until done."""

    seconds: float
    tool_seconds: float


def reassign(bootstrap: str, targets: dict[tuple[str, int], list[int]], timeout: float = 600) -> Reassignment:
    """Move the partitions to their target replicas and wait until they are done there."""
    admin = admin_client({"bootstrap.servers": bootstrap})
    before = replica_sets(admin, targets)
    began = time.monotonic()
    moving: float | None = None
    with ThreadPoolExecutor(1) as pool:
        tool = pool.submit(execute_reassignment, bootstrap, targets)
        while time.monotonic() - began < timeout:
            now = replica_sets(admin, targets)
            if moving is None and now != before:
                moving = time.monotonic()
            if all(is_done(*now[key], target) for key, target in targets.items()) and tool.done():
                tool.result()  # raises what the tool reported
                ended = time.monotonic()
                return Reassignment(ended - (moving or ended), ended - began)
            if tool.done() and tool.exception() is not None:
                tool.result()
            time.sleep(0.05)
    raise ReassignmentError(f"the reassignment to {targets} did not complete within {timeout:.0f} s")


def segment_bytes_in(partition_dir: Path) -> int:
    """The bytes of the partition's segment files (``.log``) in one broker's directory."""
    return sum(s.log.stat().st_size for s in list_segments(partition_dir))


def _create(bootstrap: str, topics: Iterable[str], broker: int, segment: int) -> None:
    admin = admin_client({"bootstrap.servers": bootstrap})
    config = {"internal.segment.bytes": str(segment)}
    new = [NewTopic(t, 1, replica_assignment=[[broker]], config=config) for t in topics]
    for future in admin.create_topics(new).values():
        future.result(60)


def _produce(bootstrap: str, topics: list[str], megabytes: int, segment: int) -> int:
    """The same ~1 KB records to each topic, in batches that fit a segment; returns the count."""
    failed: list[object] = []
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.size": min(1 << 20, segment // 2)})
    pool = [os.urandom(512).hex().encode() for _ in range(256)]
    count = megabytes * 1024 * 1024 // 1024
    for i in range(count):
        for topic in topics:
            produce_waiting(producer, topic, key=str(i).encode(), value=pool[i % 256], partition=0,
                            on_delivery=lambda err, _msg: err is None or failed.append(err))  # fmt: skip
    if producer.flush(600) != 0 or failed:
        raise click.ClickException(f"producing the benchmark data failed: {failed[:3]}")
    return count


def _tier(config: Path, log_dir: Path, topic: str, local_retention: int, segment: int) -> None:
    """Enable tiering and run the first broker's sidecar until the broker keeps about its local retention."""
    tiering_main(["topic", "enable", topic, "--local-retention-bytes", str(local_retention), "--config", str(config)],
                 standalone_mode=False)  # fmt: skip
    directory = log_dir / f"{topic}-0"
    if not tier_until(config, lambda _ctx: segment_bytes_in(directory) <= local_retention + 2 * segment, 1800):
        raise click.ClickException(f"tiering {topic} did not bring its local data down to its local retention")


def _move(endpoints: Endpoints, topic: str, source: int, target: int) -> dict[str, float | int]:
    """Move the topic's partition from ``source`` to ``target``; the time and the bytes the new replica got."""
    local = segment_bytes_in(Path(endpoints.broker(source).log_dir) / f"{topic}-0")
    took = reassign(endpoints.bootstrap, {(topic, 0): [target]})
    moved = segment_bytes_in(Path(endpoints.broker(target).log_dir) / f"{topic}-0")
    return {"seconds": round(took.seconds, 3), "tool_seconds": round(took.tool_seconds, 3), "bytes_moved": moved,
            "source_local_bytes": local}  # fmt: skip


@click.command("reassign")
@click.option("--size-mb", type=click.IntRange(8, 16384), default=256, show_default=True,
              help="Megabytes of records in each topic.")  # fmt: skip
@click.option("--local-retention-percent", type=click.FloatRange(0.1, 50), default=1.0, show_default=True,
              help="The tiered topic's local retention, in percent of its data.")  # fmt: skip
@stack_dir_option
def reassign_bench(size_mb: int, local_retention_percent: float, stack_dir: Path | None) -> None:
    """Move a tiered partition to another broker beside the same partition untiered (3-broker stack).

    Prints one JSON object per side ({side, seconds, tool_seconds, bytes_moved, source_local_bytes}) and, last, one with
    `ratio` (tiered / untiered seconds), `bytes_ratio` (tiered / untiered bytes moved) and `local_share`
    (the tiered partition's local bytes / its data before the move): the move should cost about that share.
    """
    with bench_stack(stack_dir, brokers=3) as endpoints:
        source, target = endpoints.brokers[0].id, endpoints.brokers[1].id
        stamp = f"{os.getpid()}-{int(time.time())}"
        tiered, untiered = f"bench-reassign-tiered-{stamp}", f"bench-reassign-untiered-{stamp}"
        data = size_mb << 20
        segment = max(64 << 10, data // 200)
        local_retention = int(data * local_retention_percent / 100)
        _create(endpoints.bootstrap, (tiered, untiered), source, segment)
        records = _produce(endpoints.bootstrap, [tiered, untiered], size_mb, segment)
        config = write_sidecar_config(endpoints, source)
        _tier(config, Path(endpoints.broker(source).log_dir), tiered, local_retention, segment)
        data_bytes = segment_bytes_in(Path(endpoints.broker(source).log_dir) / f"{untiered}-0")
        results = {}
        for side, topic in (("untiered", untiered), ("tiered", tiered)):
            results[side] = {"side": side, **_move(endpoints, topic, source, target)}
            click.echo(json.dumps(results[side]))
        t, u = results["tiered"], results["untiered"]
        click.echo(json.dumps({
            "ratio": round(t["seconds"] / u["seconds"], 3),
            "bytes_ratio": round(t["bytes_moved"] / u["bytes_moved"], 4),
            "local_share": round(t["source_local_bytes"] / data_bytes, 4),
            "tiered_seconds": t["seconds"], "untiered_seconds": u["seconds"],
            "tiered_tool_seconds": t["tool_seconds"], "untiered_tool_seconds": u["tool_seconds"],
            "tiered_bytes_moved": t["bytes_moved"], "untiered_bytes_moved": u["bytes_moved"],
            "records": records, "size_mb": size_mb, "segment_bytes": segment, "local_retention_bytes": local_retention,
        }))  # fmt: skip
