"""``tiering consume``: kafka-console-consumer through the TieredConsumer (remote data, then the broker)."""

from __future__ import annotations

import binascii
import json
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import click
from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, Consumer, KafkaError, KafkaException, TopicPartition

from reader import ReaderSettings, TieredConsumer, TieredMessage, load_reader_settings
from tiering.cli.common import config_option
from tiering_core.errors import TieringError
from tiering_core.kafka_client import client_properties
from tiering_core.kafka_cluster import kafka_error_text
from tiering_core.kafka_logs import kafka_logging

# Without --timeout-ms: how long the cluster may take to answer the first metadata request.
CONNECT_TIMEOUT_MS = 10_000
# Errors of a read that may pass (a store or broker that comes back); any other error ends the command.
_RETRIABLE = {KafkaError._TRANSPORT, KafkaError._TIMED_OUT, KafkaError.REQUEST_TIMED_OUT}


class StartOffset(click.ParamType):
    """``earliest``, ``latest`` or an offset (N >= 0)."""

    name = "earliest|latest|N"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str | int:
        if isinstance(value, int) or value in ("earliest", "latest"):
            return value  # type: ignore[no-any-return]
        try:
            number = int(value)
        except ValueError:
            self.fail(f"{value!r} is not earliest, latest or an offset", param, ctx)
        if number < 0:
            self.fail(f"{number} is not an offset (offsets start at 0)", param, ctx)
        return number


def _settings(config_file: Path | None, bootstrap: str | None) -> ReaderSettings:
    overrides = {"bootstrap_servers": bootstrap} if bootstrap else {}
    try:
        return load_reader_settings(config_file, **overrides)
    except TieringError as exc:
        raise click.ClickException(str(exc)) from exc


def _text(data: bytes | None) -> str:
    return "null" if data is None else data.decode("utf-8", errors="replace")


def _json_bytes(data: bytes | str | None) -> dict[str, str] | None:
    """Bytes as {"encoding": "utf-8", "data": text} when they are valid UTF-8, else base64; None stays null."""
    if data is None:
        return None
    if isinstance(data, str):
        return {"encoding": "utf-8", "data": data}
    try:
        return {"encoding": "utf-8", "data": data.decode("utf-8")}
    except UnicodeDecodeError:
        return {"encoding": "base64", "data": binascii.b2a_base64(data, newline=False).decode("ascii")}


def record_json(m: Any) -> str:
    """One record as kcat -J prints it, with bytes tagged by their encoding (see ``_json_bytes``)."""
    kind, ts = m.timestamp()
    return json.dumps({
        "topic": m.topic(), "partition": m.partition(), "offset": m.offset(),
        "timestamp": ts if kind else None,  # 0: TIMESTAMP_NOT_AVAILABLE
        "key": _json_bytes(m.key()), "value": _json_bytes(m.value()),
        "headers": [{"key": k, "value": _json_bytes(v)} for k, v in (m.headers() or [])],
        "source": "remote" if isinstance(m, TieredMessage) else "broker",
    })  # fmt: skip


def _check_start(config: dict[str, Any], topic: str, partition: int | None, offset: str | int,
                 timeout_ms: int) -> list[TopicPartition]:  # fmt: skip
    """Fail (exit 1) with a sentence, within ``timeout_ms``, when the cluster cannot be reached, the topic or
    partition does not exist or ``offset`` is past the partition's end; returns the partitions to read, each at
    the offset to assign (all of the topic's without ``partition``).

    Asked with a plain consumer before the TieredConsumer exists: that one opens the metadata catalog,
    which waits for the cluster far longer than ``timeout_ms``."""
    bootstrap = config["bootstrap.servers"]
    consumer = Consumer({k: v for k, v in config.items() if k != "enable.auto.commit"})
    try:
        return _start_offsets(consumer, bootstrap, topic, partition, offset, timeout_ms)
    finally:
        consumer.close()


def _start_offsets(consumer: Consumer, bootstrap: str, topic: str, partition: int | None, offset: str | int,
                   timeout_ms: int) -> list[TopicPartition]:  # fmt: skip
    try:
        metadata = consumer.list_topics(topic, timeout=timeout_ms / 1000)
    except KafkaException as exc:
        raise click.ClickException(
            f"cannot reach the Kafka cluster at {bootstrap} within {timeout_ms} ms: {kafka_error_text(exc.args[0])}"
        ) from None
    described = metadata.topics.get(topic)
    if described is None or described.error is not None:
        why = "" if described is None else f" ({described.error.str()})"
        raise click.ClickException(f"topic {topic!r} does not exist in the cluster at {bootstrap}{why}")
    if partition is not None and partition not in described.partitions:
        raise click.ClickException(
            f"topic {topic!r} has no partition {partition} (it has {len(described.partitions)} partitions)"
        )
    partitions = sorted(described.partitions) if partition is None else [partition]
    if offset in ("latest", "earliest"):
        start = OFFSET_END if offset == "latest" else OFFSET_BEGINNING
        return [TopicPartition(topic, p, start) for p in partitions]
    assert isinstance(offset, int) and partition is not None
    try:
        _, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=timeout_ms / 1000)
    except KafkaException as exc:
        raise click.ClickException(
            f"cannot read the offsets of {topic} partition {partition} from Kafka at {bootstrap}: "
            f"{kafka_error_text(exc.args[0])}"
        ) from None
    if offset > high:
        raise click.ClickException(f"offset {offset} is past the end of {topic}-{partition} (next offset: {high})")
    return [TopicPartition(topic, partition, offset)]


def _failure(m: Any, settings: ReaderSettings) -> str:
    error = m.error()
    return (f"cannot read {m.topic()} partition {m.partition()} (brokers {settings.bootstrap_servers}, "
            f"remote storage {settings.remote_storage.kind}): {error.str()}")  # fmt: skip


@click.command()
@click.argument("topic")
@click.option("--from-beginning", is_flag=True, help="Start at the oldest record: the remote start (Rx).")
@click.option(
    "--offset", type=StartOffset(), default=None,
    help="Where to start: earliest (the remote start), latest, or an offset N (N needs --partition).",
)  # fmt: skip
@click.option("--partition", type=click.IntRange(0), default=None, help="Read only this partition.")
@click.option("--max-messages", type=click.IntRange(1), default=None, help="Exit after this many messages.")
@click.option(
    "--timeout-ms", type=click.IntRange(1), default=None,
    help=f"Exit when no message came for this long; also how long the cluster may take to answer "
    f"(default {CONNECT_TIMEOUT_MS} ms for that).",
)  # fmt: skip
@click.option(
    "--group", default=None,
    help="Join this consumer group and commit positions to it (default: no group; every partition assigned, "
    "as kcat does, so no rebalance ever restarts a partition from --from-beginning).",
)  # fmt: skip
@click.option(
    "--isolation-level", type=click.Choice(["read_committed", "read_uncommitted"]), default="read_uncommitted",
    show_default=True, help="read_committed drops aborted transactions, as the broker does.",
)  # fmt: skip
@click.option("--print-key", is_flag=True, help="Print the key before the value (tab-separated).")
@click.option("--print-offset", is_flag=True, help="Print partition:offset and where the record came from.")
@click.option(
    "--json", "as_json", is_flag=True,
    help='One JSON object per record (like kcat -J): topic, partition, offset, timestamp, key, value, headers, '
    'source; key, value and header values as {"encoding": "utf-8"|"base64", "data": ...} or null.',
)  # fmt: skip
@click.option("--bootstrap-server", default=None, help="Kafka bootstrap servers (default: from the configuration).")
@config_option
def consume(topic: str, from_beginning: bool, offset: str | int | None, partition: int | None,
            max_messages: int | None, timeout_ms: int | None, group: str | None, isolation_level: str,
            print_key: bool, print_offset: bool, as_json: bool, bootstrap_server: str | None,
            config_file: Path | None) -> None:  # fmt: skip
    """Print the records of TOPIC, like kafka-console-consumer, including those only in remote storage.

    Offsets below the broker's log start are read from the remote copies; at the boundary the
    consumer hands over to the broker. --from-beginning (or --offset earliest) starts at the remote start.
    The reader's settings (remote storage, prefetch pool, download rate) come from --config (a sidecar's
    file works) and TIERING_* variables. Values print as UTF-8 ("null" for a null value), one per line,
    or as JSON with --json.

    Exits 1 with one line on stderr when the cluster cannot be reached, the topic or partition does not
    exist, the offset is past the partition's end, or a record cannot be read (remote storage unreachable
    for --timeout-ms, or a remote object missing or corrupt).
    """
    if isinstance(offset, int) and partition is None:
        raise click.UsageError("--offset N needs --partition")
    if offset is not None and from_beginning:
        raise click.UsageError("--offset and --from-beginning exclude each other")
    earliest = from_beginning or offset == "earliest"
    settings = _settings(config_file, bootstrap_server)
    config = {
        "bootstrap.servers": settings.bootstrap_servers,
        "group.id": group or f"tiering-console-consumer-{uuid.uuid4().hex[:8]}",
        "auto.offset.reset": "earliest" if earliest else "latest",
        "isolation.level": isolation_level,
        "enable.auto.commit": group is not None,
        **kafka_logging(),  # librdkafka's lines through the CLI's log, on stderr
        **client_properties(settings.kafka_client),
    }
    starts = _check_start(config, topic, partition,
                          "earliest" if earliest else (offset if offset is not None else "latest"),
                          timeout_ms or CONNECT_TIMEOUT_MS)  # fmt: skip
    count = 0
    try:
        with TieredConsumer(config, settings) as consumer:
            if group is not None and partition is None:
                consumer.subscribe([topic])  # the group's members share the partitions and commit positions
            else:
                consumer.assign(starts)  # no group to join: no rebalance can send a position back
            last = time.monotonic()
            failing: str | None = None  # the last retriable error since the last record
            while max_messages is None or count < max_messages:
                if timeout_ms is not None and time.monotonic() - last > timeout_ms / 1000:
                    if failing is not None:
                        raise click.ClickException(f"{failing} (for {timeout_ms} ms)")
                    break
                wanted = 500 if max_messages is None else min(500, max_messages - count)
                for m in consumer.consume(wanted, 0.5):
                    if m.error() is not None:
                        if m.error().code() == KafkaError._PARTITION_EOF:
                            continue
                        if m.error().code() not in _RETRIABLE and not m.error().retriable():
                            raise click.ClickException(_failure(m, settings))
                        if failing is None:
                            click.echo(f"warning: {_failure(m, settings)}; retrying", err=True)
                        failing = _failure(m, settings)
                        continue
                    if as_json:
                        click.echo(record_json(m))
                    else:
                        fields = []
                        if print_offset:
                            source = "remote" if isinstance(m, TieredMessage) else "broker"
                            fields.append(f"{m.partition()}:{m.offset()} {source}")
                        if print_key:
                            fields.append(_text(m.key()))
                        fields.append(_text(m.value()))
                        click.echo("\t".join(fields))
                    count += 1
                    last = time.monotonic()
                    failing = None
    except TieringError as exc:
        raise click.ClickException(str(exc)) from exc
    except KafkaException as exc:
        where = f"{topic}" if partition is None else f"{topic} partition {partition}"
        raise click.ClickException(
            f"cannot read {where} from Kafka at {settings.bootstrap_servers}: {kafka_error_text(exc.args[0])}"
        ) from None
    except KeyboardInterrupt:
        pass
    finally:
        print(f"Processed a total of {count} messages", file=sys.stderr)
