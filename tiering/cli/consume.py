"""``tiering consume``: kafka-console-consumer through the TieredConsumer (remote data, then the broker)."""

from __future__ import annotations

import sys
import time
import uuid
from pathlib import Path

import click
from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, TopicPartition

from reader import ReaderSettings, TieredConsumer, TieredMessage, load_reader_settings
from tiering.cli.common import config_option
from tiering_core.errors import TieringError
from tiering_core.kafka_client import client_properties
from tiering_core.kafka_logs import kafka_logging


def _settings(config_file: Path | None, bootstrap: str | None) -> ReaderSettings:
    overrides = {"bootstrap_servers": bootstrap} if bootstrap else {}
    try:
        return load_reader_settings(config_file, **overrides)
    except TieringError as exc:
        raise click.ClickException(str(exc)) from exc


def _text(data: bytes | None) -> str:
    return "null" if data is None else data.decode("utf-8", errors="replace")


@click.command()
@click.argument("topic")
@click.option("--from-beginning", is_flag=True, help="Start at the oldest record: the remote start (Rx).")
@click.option("--offset", type=click.IntRange(0), default=None, help="Start at this offset (needs --partition).")
@click.option("--partition", type=click.IntRange(0), default=None, help="Read only this partition (no group).")
@click.option("--max-messages", type=click.IntRange(1), default=None, help="Exit after this many messages.")
@click.option("--timeout-ms", type=click.IntRange(1), default=None, help="Exit when no message came for this long.")
@click.option("--group", default=None, help="Consumer group (default: a new tiering-console-consumer-* group).")
@click.option(
    "--isolation-level", type=click.Choice(["read_committed", "read_uncommitted"]), default="read_uncommitted",
    show_default=True, help="read_committed drops aborted transactions, as the broker does.",
)  # fmt: skip
@click.option("--print-key", is_flag=True, help="Print the key before the value (tab-separated).")
@click.option("--print-offset", is_flag=True, help="Print partition:offset and where the record came from.")
@click.option("--bootstrap-server", default=None, help="Kafka bootstrap servers (default: from the configuration).")
@config_option
def consume(topic: str, from_beginning: bool, offset: int | None, partition: int | None, max_messages: int | None,
            timeout_ms: int | None, group: str | None, isolation_level: str, print_key: bool, print_offset: bool,
            bootstrap_server: str | None, config_file: Path | None) -> None:  # fmt: skip
    """Print the records of TOPIC, like kafka-console-consumer, including those only in remote storage.

    Offsets below the broker's log start are read from the remote copies; at the boundary the
    consumer hands over to the broker. --from-beginning starts at the remote start. The reader's
    settings (remote storage, prefetch pool, download rate) come from --config (a sidecar's file works)
    and TIERING_* variables. Values print as UTF-8 ("null" for a null value), one per line.
    """
    if offset is not None and partition is None:
        raise click.UsageError("--offset needs --partition")
    if offset is not None and from_beginning:
        raise click.UsageError("--offset and --from-beginning exclude each other")
    settings = _settings(config_file, bootstrap_server)
    config = {
        "bootstrap.servers": settings.bootstrap_servers,
        "group.id": group or f"tiering-console-consumer-{uuid.uuid4().hex[:8]}",
        "auto.offset.reset": "earliest" if from_beginning else "latest",
        "isolation.level": isolation_level,
        "enable.auto.commit": group is not None,
        **kafka_logging(),  # librdkafka's lines through the CLI's log, on stderr
        **client_properties(settings.kafka_client),
    }
    count = 0
    try:
        with TieredConsumer(config, settings) as consumer:
            if partition is not None:
                start = offset if offset is not None else (OFFSET_BEGINNING if from_beginning else OFFSET_END)
                consumer.assign([TopicPartition(topic, partition, start)])
            else:
                consumer.subscribe([topic])
            last = time.monotonic()
            while max_messages is None or count < max_messages:
                if timeout_ms is not None and time.monotonic() - last > timeout_ms / 1000:
                    break
                wanted = 500 if max_messages is None else min(500, max_messages - count)
                for m in consumer.consume(wanted, 0.5):
                    if m.error() is not None:
                        click.echo(f"error: {m.topic()}-{m.partition()}: {m.error().str()}", err=True)
                        continue
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
    except TieringError as exc:
        raise click.ClickException(str(exc)) from exc
    except KeyboardInterrupt:
        pass
    finally:
        print(f"Processed a total of {count} messages", file=sys.stderr)
