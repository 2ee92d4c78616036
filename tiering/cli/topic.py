"""``tiering topic`` and ``tiering cluster``: per-topic and cluster-wide tiering controls and status.

Every change is a record in the metadata WAL, applied through segment_fsm by every sidecar.
Enabling never touches the topic's Kafka configuration: retention.ms / retention.bytes stay the
total retention (KIP-405), so if the sidecars stop, brokers keep data locally up to what was meant.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from metadata import ClusterRecord, TopicRecord
from metadata.records import topic_id_str
from segment_fsm import LogStarts, SegmentState, TopicAction
from tiering.cli.common import Admin, admin_context, cluster_options, confirm_or_refuse, settings_from, yes_option
from tiering.policy import RetentionSettings
from tiering.policy.tierable import name_refusal, refusal
from tiering.sidecar.context import SidecarContext
from tiering.sidecar.retry import Scope
from tiering.sidecar.status import read_status, status_key
from tiering.sidecar.writer import PartitionWriter
from tiering_core.errors import ConfigError, TieringError
from tiering_core.kafka_cluster import KafkaClusterError, TopicInfo

console = Console()


def _topic_info(ctx: SidecarContext, name: str) -> TopicInfo:
    if name not in ctx.cluster.topic_names():
        raise click.ClickException(f"topic {name!r} does not exist in the cluster at {ctx.cluster.bootstrap}")
    try:
        return ctx.cluster.topics([name])[name]
    except KafkaClusterError as exc:
        raise click.ClickException(str(exc)) from exc


def _publish_topic(ctx: SidecarContext, info: TopicInfo, action: TopicAction, **retention: int) -> None:
    record = TopicRecord(topic=info.name, topic_id=info.topic_id, action=action, event_time=ctx.now_ms(), **retention)
    result = ctx.manager.publish(record)
    if not result.accepted:
        raise click.ClickException(result.reason or "rejected")


@click.group()
def topic() -> None:
    """Enable, pause, resume or roll back tiered storage of a topic, and show its status."""


def _retention_options(default: int | None, unset: str) -> Any:
    """--local-retention-ms and --local-retention-bytes, as ``enable`` and ``alter`` take them."""
    ms = click.option(
        "--local-retention-ms", type=click.IntRange(-2), default=default, show_default=default is not None,
        help="local.retention.ms: how long data stays on the broker's disk once uploaded (-2: same as "
        f"retention.ms, -1: unlimited){unset}.",
    )  # fmt: skip
    size = click.option(
        "--local-retention-bytes", type=click.IntRange(-2), default=default, show_default=default is not None,
        help=f"local.retention.bytes per partition on the broker's disk (-2: same as retention.bytes, -1: unlimited)"
        f"{unset}.",
    )  # fmt: skip
    return lambda f: ms(size(f))


def _checked_retention(info: TopicInfo, local_retention_ms: int, local_retention_bytes: int) -> None:
    """Refuse (exit 1) a local retention above the topic's total retention.ms / retention.bytes."""
    try:
        RetentionSettings(
            retention_ms=info.config_int("retention.ms", 7 * 24 * 3600 * 1000),
            retention_bytes=info.config_int("retention.bytes", -1),
            local_retention_ms=local_retention_ms,
            local_retention_bytes=local_retention_bytes,
        )
    except ConfigError as exc:
        raise click.ClickException(f"topic {info.name}: {exc}") from exc


def _total_retention(info: TopicInfo) -> str:
    total_ms, total_bytes = info.configs.get("retention.ms", "default"), info.configs.get("retention.bytes", "-1")
    return f"the total retention stays retention.ms={total_ms}, retention.bytes={total_bytes}"


@topic.command()
@click.argument("name")
@_retention_options(-2, "")
@cluster_options
def enable(name: str, local_retention_ms: int, local_retention_bytes: int, config_file: Path | None,
           timeout: float) -> None:  # fmt: skip
    """Start tiering topic NAME: upload rolled segments, keep only the local retention on disk.

    The topic's retention.ms / retention.bytes are not changed: they stay the total retention.
    Refused: internal topics (names starting with __, the metadata WAL), Kafka Streams' internal topics
    (-changelog, -repartition), compacted topics, and a local retention above the total.
    To change the local retention later, use ``tiering topic alter``.
    """
    metadata_topic = settings_from(config_file).metadata_topic
    reason = name_refusal(name, metadata_topic)  # before any lookup: __cluster_metadata is not even listed
    if reason is not None:
        raise click.ClickException(reason)
    with admin_context(config_file, timeout) as admin:
        ctx = admin.ctx
        info = _topic_info(ctx, name)
        reason = refusal(info, metadata_topic)
        if reason is not None:
            raise click.ClickException(reason)
        _checked_retention(info, local_retention_ms, local_retention_bytes)
        state = ctx.manager.tiering(info.topic_id)  # this incarnation of the name, not an older one
        if state is not None and state.enabled:
            click.echo(
                f"tiering is already enabled for {name} (local.retention.ms={state.local_retention_ms}, "
                f"local.retention.bytes={state.local_retention_bytes}); nothing changed (to change the local "
                f"retention: tiering topic alter {name})"
            )
            return
        _publish_topic(ctx, info, TopicAction.ENABLE, local_retention_ms=local_retention_ms,
                       local_retention_bytes=local_retention_bytes)  # fmt: skip
        click.echo(
            f"enabled tiering for {name} ({len(info.partitions)} partitions): local.retention.ms={local_retention_ms}, "
            f"local.retention.bytes={local_retention_bytes}; {_total_retention(info)}"
        )


@topic.command()
@click.argument("name")
@_retention_options(None, " (default: unchanged)")
@cluster_options
def alter(name: str, local_retention_ms: int | None, local_retention_bytes: int | None,
          config_file: Path | None, timeout: float) -> None:  # fmt: skip
    """Change the local retention of tiered topic NAME (validated as ``enable`` does).

    A setting not given stays as it is; the topic's retention.ms / retention.bytes are not changed.
    """
    if local_retention_ms is None and local_retention_bytes is None:
        raise click.UsageError("give --local-retention-ms and/or --local-retention-bytes")
    with admin_context(config_file, timeout) as admin:
        ctx = admin.ctx
        info = _topic_info(ctx, name)
        state = ctx.manager.tiering(info.topic_id)
        if state is None or not state.enabled:
            raise click.ClickException(f"tiering is not enabled for {name}: run tiering topic enable {name} first")
        ms = state.local_retention_ms if local_retention_ms is None else local_retention_ms
        size = state.local_retention_bytes if local_retention_bytes is None else local_retention_bytes
        _checked_retention(info, ms, size)
        if (ms, size) == (state.local_retention_ms, state.local_retention_bytes):
            click.echo(f"{name}: local.retention.ms={ms}, local.retention.bytes={size} already; nothing changed")
            return
        _publish_topic(ctx, info, TopicAction.UPDATE_RETENTION, local_retention_ms=ms, local_retention_bytes=size)
        click.echo(
            f"{name}: local.retention.ms {state.local_retention_ms} -> {ms}, local.retention.bytes "
            f"{state.local_retention_bytes} -> {size}; {_total_retention(info)}"
        )


def _simple_action(action: TopicAction, done: str, doc: str) -> click.Command:
    @click.argument("name")
    @cluster_options
    def command(name: str, config_file: Path | None, timeout: float) -> None:
        with admin_context(config_file, timeout) as admin:
            _publish_topic(admin.ctx, _topic_info(admin.ctx, name), action)
            click.echo(f"{name}: {done}")

    command.__doc__ = doc
    return click.command(action.name.lower().replace("_", "-"))(command)


topic.add_command(_simple_action(TopicAction.PAUSE_UPLOAD, "uploads paused", "Stop uploading segments of topic NAME."))
topic.add_command(_simple_action(TopicAction.RESUME_UPLOAD, "uploads resumed", "Resume uploads of topic NAME."))
topic.add_command(
    _simple_action(TopicAction.PAUSE_DOWNLOAD, "remote reads paused", "Stop serving reads of NAME from remote.")
)
topic.add_command(
    _simple_action(TopicAction.RESUME_DOWNLOAD, "remote reads resumed", "Serve reads of NAME from remote again.")
)


@topic.command()
@click.argument("name")
@click.option("--delete-remote", is_flag=True, help="Also delete every remote object of the topic (asks first).")
@yes_option
@cluster_options
def rollback(name: str, delete_remote: bool, yes: bool, config_file: Path | None, timeout: float) -> None:
    """Stop tiering topic NAME: no more uploads and no more local deletion by the sidecar.

    From then on the broker's own retention governs the local log. The remote copy stays readable
    until its retention, unless --delete-remote deletes it now (through the segment state machine):
    that first lists, per partition, the offsets that exist only in remote storage (below the broker's
    log start offset) and needs --yes or a confirmation typed at a terminal; otherwise nothing changes.
    """
    with admin_context(config_file, timeout, store_needed=delete_remote) as admin:
        ctx = admin.ctx
        info = _topic_info(ctx, name)
        if delete_remote:
            click.echo(f"{name}: --delete-remote deletes every remote copy; offsets that exist only there "
                       "(below the broker's log start offset):")  # fmt: skip
            for row in partition_rows(ctx, info):
                click.echo(f"  partition {row['partition']}: {_remote_only(row['Rx'], row['Ry'], row['Lx'])}")
            confirm_or_refuse(f"Roll back {name} and delete its remote data for good?", yes,
                              f"nothing was rolled back or deleted for {name}")  # fmt: skip
        current = ctx.manager.tiering(info.topic_id)
        if current is not None and current.rolled_back:
            click.echo(f"{name}: already rolled back")
        else:
            _publish_topic(ctx, info, TopicAction.ROLLBACK)
            click.echo(f"{name}: rolled back; the broker's retention now governs its local log")
        if delete_remote:
            deleted = _delete_remote(ctx, info)
            click.echo(f"{name}: deleted {deleted} remote segment copies and every object under the topic's prefix")


def _remote_only(rx: int | None, ry: int | None, lx: int) -> str:
    """The remote range below the broker's log start offset Lx, [Rx, min(Ry, Lx - 1)], as a user reads it."""
    if rx is None or ry is None or min(ry, lx - 1) < rx:
        return "none"
    last = min(ry, lx - 1)
    return f"offsets {rx}-{last} ({last - rx + 1} offsets)"


def _delete_remote(ctx: SidecarContext, info: TopicInfo) -> int:
    deleted = 0
    for p in info.partitions:
        summary = ctx.manager.partition_state(info.topic_id, p.partition)
        epoch, token = summary.fence if summary is not None else (0, 0)
        writer = PartitionWriter(ctx, Scope(info.name, info.topic_id, p.partition), epoch, token)
        for seg in writer.undeleted_copies():
            if not writer.delete_copy(seg):
                raise TieringError(f"could not delete remote copy at offset {seg.base_offset} of {writer.name}")
            deleted += 1
        writer.delete_leftovers()
    return deleted


def partition_rows(ctx: SidecarContext, info: TopicInfo) -> list[dict[str, Any]]:
    """One status row per partition: Kafka's offsets, the remote range, copy lag, states, last error."""
    offsets = ctx.cluster.local_offsets([(info.name, p.partition) for p in info.partitions])
    status = read_status(ctx.settings.state_dir)["partitions"]
    rows = []
    for p in info.partitions:
        local = offsets[(info.name, p.partition)]
        summary = ctx.manager.partition_state(info.topic_id, p.partition)
        rx = summary.remote_start_offset if summary else None
        ry = summary.remote_end_offset if summary else None
        counts = summary.segment_counts if summary else {s.name: 0 for s in SegmentState}
        remote_bytes = summary.remote_size if summary else 0
        starts = summary.log_starts if summary else LogStarts()
        side = status.get(status_key(info.topic_id, p.partition), {})
        rows.append(
            {
                "partition": p.partition, "leader": p.leader, "Lx": local.lx, "Ly": local.ly, "Lz": local.lz,
                "Rx": rx, "Ry": ry, "remote_bytes": remote_bytes,
                "local_log_start_offset": starts.local, "log_start_offset": starts.log_start,  # -1: none recorded
                "copy_lag_bytes": side.get("copy_lag_bytes"), "copy_lag_segments": side.get("copy_lag_segments"),
                "segments": counts, "last_error": side.get("last_error"), "failing": side.get("failing", {}),
                "next_retry_ms": side.get("next_retry_ms"),
            }
        )  # fmt: skip
    return rows


@topic.command()
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@cluster_options
def status(name: str, as_json: bool, config_file: Path | None, timeout: float) -> None:
    """Per partition of NAME: Lx, Ly, Lz (Kafka), Rx, Ry (remote), copy lag, segments per state, last error.

    Read-only: it creates nothing. Copy lag, last error and next retry come from the status file of a sidecar
    on this host (state_dir): '-' elsewhere. A store that does not answer is reported after what is known
    (from Kafka and the metadata WAL), with exit code 1.
    """
    with admin_context(config_file, timeout, read_only=True) as admin:
        ctx = admin.ctx
        info = _topic_info(ctx, name)
        tiering = ctx.manager.tiering(info.topic_id)
        rows = partition_rows(ctx, info)
    store = {"endpoint": ctx.store.endpoint, "reachable": admin.store_error is None, "error": admin.store_error}
    if as_json:
        click.echo(json.dumps({"topic": name, "topic_id": info.topic_id, "tiering": vars_or_none(tiering),
                               "partitions": rows, "store": store}, default=str))  # fmt: skip
        admin.fail_if_store_unreachable()
        return
    title = f"{name} ({info.topic_id}): " + (
        "not tiered" if tiering is None else
        ", ".join(k for k in ("enabled", "upload_paused", "download_paused", "rolled_back") if getattr(tiering, k))
    )  # fmt: skip
    table = Table(title=title)
    for col in ("partition", "Lx", "Ly", "Lz", "Rx", "Ry", "copy lag", "started/finished/deleting", "last error",
                "next retry"):  # fmt: skip
        table.add_column(col)
    for r in rows:
        c = r["segments"]
        lag = "-" if r["copy_lag_bytes"] is None else f"{r['copy_lag_bytes']:,} B / {r['copy_lag_segments']} seg"
        table.add_row(
            str(r["partition"]), str(r["Lx"]), str(r["Ly"]), str(r["Lz"]), _shown(r["Rx"]), _shown(r["Ry"]), lag,
            f"{c['COPY_SEGMENT_STARTED']}/{c['COPY_SEGMENT_FINISHED']}/{c['DELETE_SEGMENT_STARTED']}",
            r["last_error"] or "", _retry_time(r["next_retry_ms"]),
        )  # fmt: skip
    Console(width=160).print(table)
    admin.fail_if_store_unreachable()


def _shown(value: object) -> str:
    """A table cell: '-' for what does not exist (no remote data: no Rx, Ry), not Python's None."""
    return "-" if value is None else str(value)


def _retry_time(ms: int | None) -> str:
    """When a failing operation is tried again, in local time; '' when nothing is failing."""
    return "" if ms is None else time.strftime("%H:%M:%S", time.localtime(ms / 1000))


def vars_or_none(value: object) -> dict[str, Any] | None:
    if value is None:
        return None
    return {k: getattr(value, k) for k in value.__slots__}  # type: ignore[attr-defined]


@click.group()
def cluster() -> None:
    """Pause, resume or roll back tiering for every topic at once, and show what is tiered."""


def _cluster_action(action: TopicAction, done: str, doc: str) -> click.Command:
    @cluster_options
    def command(config_file: Path | None, timeout: float) -> None:
        with admin_context(config_file, timeout) as admin:
            ctx = admin.ctx
            result = ctx.manager.publish(ClusterRecord(action=action, event_time=ctx.now_ms()))
            if not result.accepted:
                raise click.ClickException(result.reason or "rejected")
            click.echo(done)

    command.__doc__ = doc
    return click.command(action.name.lower().replace("_", "-"))(command)


cluster.add_command(_cluster_action(TopicAction.PAUSE_UPLOAD, "uploads paused cluster-wide", "Stop all uploads."))
cluster.add_command(_cluster_action(TopicAction.RESUME_UPLOAD, "uploads resumed cluster-wide", "Resume uploads."))
cluster.add_command(
    _cluster_action(
        TopicAction.ROLLBACK, "tiering rolled back cluster-wide", "Stop uploads and local deletion everywhere."
    )
)


def topic_rows(admin: Admin) -> list[dict[str, Any]]:
    """One row per tiered topic name: its incarnation Kafka has now (else the newest one), with its topic id,
    whether Kafka has it (None: unknown), and the ids of earlier incarnations of the name (deleted topics whose
    remote data the sidecars delete after deleted_topic_grace_seconds)."""
    with admin.ctx.manager.lock:
        entries = {topic_id_str(tid): (n, t) for tid, (n, t) in admin.ctx.manager.state.topics.items()}
    names = {n for n, _ in entries.values()}
    live = admin.ctx.cluster.topic_ids(names)
    rows = []
    for name in sorted(names):
        ids = [tid for tid, (n, _) in entries.items() if n == name]
        newest = admin.ctx.manager.topic_state(name)
        shown = live.get(name) if live.get(name) in ids else (newest[0] if newest else ids[0])
        in_kafka = None if name not in live else live[name] == shown
        rows.append({"topic": name, "topic_id": shown, "in_kafka": in_kafka, **(vars_or_none(entries[shown][1]) or {}),
                     "earlier_topic_ids": sorted(set(ids) - {shown})})  # fmt: skip
    return rows


@cluster.command("status")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@cluster_options
def cluster_status(as_json: bool, config_file: Path | None, timeout: float) -> None:
    """Cluster-wide switches and every topic with a tiering state (once per name, with its topic id).

    Read-only: it creates nothing. A store that does not answer is reported after the list, with exit code 1.
    """
    with admin_context(config_file, timeout, read_only=True) as admin:
        cluster_flags = admin.ctx.manager.cluster_state()
        flags = {"upload_paused": cluster_flags.upload_paused, "rolled_back": cluster_flags.rolled_back}
        topics = topic_rows(admin)
    if as_json:
        click.echo(json.dumps({"cluster": flags, "topics": topics, "store": {
            "endpoint": admin.ctx.store.endpoint, "reachable": admin.store_error is None, "error": admin.store_error
        }}))  # fmt: skip
        admin.fail_if_store_unreachable()
        return
    if admin.no_metadata is not None:
        click.echo(f"cluster: nothing is tiered ({admin.no_metadata})")
        admin.fail_if_store_unreachable()
        return
    click.echo(f"cluster: upload_paused={flags['upload_paused']} rolled_back={flags['rolled_back']}")
    table = Table()
    for col in ("topic", "topic id", "in Kafka", "enabled", "upload paused", "download paused", "rolled back",
                "local.retention.ms", "local.retention.bytes", "earlier topic ids"):  # fmt: skip
        table.add_column(col)
    for t in topics:
        table.add_row(t["topic"], t["topic_id"], {True: "yes", False: "no (deleted)", None: "?"}[t["in_kafka"]],
                      str(t["enabled"]), str(t["upload_paused"]), str(t["download_paused"]), str(t["rolled_back"]),
                      str(t["local_retention_ms"]), str(t["local_retention_bytes"]),
                      ", ".join(t["earlier_topic_ids"]))  # fmt: skip
    Console(width=200).print(table)
    admin.fail_if_store_unreachable()
