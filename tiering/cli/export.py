"""``tiering export``: a topic's tiered data to Parquet, Delta or Iceberg with Spark, reading the object store (and,
on the driver, the metadata for log start offsets users set with ``delete_records``)."""

from __future__ import annotations

import json
import os
import re
import threading
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from tiering.cli.common import DEFAULT_TIMEOUT_SECONDS, check_cluster, config_option, settings_from
from tiering.config import SidecarSettings
from tiering_core.errors import ConfigError, TieringError
from tiering_core.kafka_client import client_properties
from tiering_core.schema_registry import (
    DECODED_FORMATS,
    RegisteredSchema,
    export_format,
    schemas_from_registry,
    schemas_from_topic,
)
from tiering_core.stores.base import RemoteStoreError

if TYPE_CHECKING:
    from reader.spark.export import ExportRequest, ExportResult

console = Console(stderr=True)


def user_log_starts(config_file: Path | None, topic: str, timeout: float) -> dict[str, dict[int, int]]:
    """The log start offsets users set on the topic with ``delete_records``, from the metadata (see
    ``MetadataCatalog.user_log_starts``): the export leaves the records below them out, as the broker and
    the TieredConsumer do, also where a remote copy still holds them. A cluster that does not answer within
    ``timeout`` is one sentence (exit 1), before Spark starts."""
    from reader.catalog import MetadataCatalog
    from reader.config import load_reader_settings
    from reader.errors import UnknownTopic
    from tiering_core.kafka_cluster import KafkaCluster
    from tiering_core.stores.factory import open_store

    try:
        settings = load_reader_settings(config_file)
        cluster = KafkaCluster(settings.bootstrap_servers, client_config=client_properties(settings.kafka_client))
        check_cluster(cluster.admin, settings.bootstrap_servers, timeout)
        catalog = MetadataCatalog(settings, open_store(settings.remote_storage), cluster, [topic]).start()
    except UnknownTopic:  # not a live topic: the planner reports what the store holds of it, if anything
        return {}
    except (TieringError, RemoteStoreError) as exc:
        raise click.ClickException(f"reading the tiering metadata of {topic}: {exc}") from exc
    try:
        return catalog.user_log_starts(topic)
    finally:
        catalog.close()


def registry_versions(
    settings: SidecarSettings, subjects: list[str], timeout: float
) -> list[tuple[RegisteredSchema, ...]]:
    """Each subject's versions, on the driver before Spark starts: from the registry's REST API when
    ``schema_registry.url`` is set, else from its storage topic on the cluster (read once). A subject with none
    is one sentence (exit 1)."""
    if not subjects:
        return []  # neither keys nor values are read with a schema: no registry to ask
    registry = settings.schema_registry
    try:
        if registry.url:
            catalog = schemas_from_registry(registry.client_config(), subjects)
        else:
            catalog = schemas_from_topic(settings.bootstrap_servers, client_properties(settings.kafka_client),
                                         registry.topic, timeout)  # fmt: skip
    except TieringError as exc:
        raise click.ClickException(str(exc)) from exc
    found = []
    for subject in subjects:
        versions = catalog.versions(subject)
        if not versions:
            where = registry.url or f"topic {registry.topic}"
            raise click.ClickException(f"subject {subject} has no schema in the schema registry ({where})")
        found.append(tuple(versions))
    return found


def iceberg_catalog(name: str) -> None:
    """Load the Iceberg catalog ``name`` once before Spark starts: one sentence when pyiceberg cannot (not
    configured, unreachable), not a traceback after the job."""
    from pyiceberg.catalog import load_catalog

    try:
        load_catalog(name)
    except Exception as exc:  # pyiceberg raises ValueError, its own errors, the database driver's
        raise click.ClickException(
            f"the Iceberg catalog {name!r} cannot be loaded (configured as pyiceberg "
            f"names catalogs: ~/.pyiceberg.yaml or PYICEBERG_CATALOG__...): {exc}"
        ) from exc


def parse_position(text: str | None, what: str) -> tuple[dict[int, int], int | None]:
    """``--from``/``--to``: an offset for every partition (``1200``), per partition (``0:1200,1:900``),
    an ISO time (``2026-01-31T12:00:00Z``) or milliseconds since the epoch (``@1767000000000``).
    Returns (offsets by partition, timestamp ms)."""
    if text is None:
        return {}, None
    try:
        if text.startswith("@"):
            return {}, int(text[1:])
        if ":" in text and all(":" in part and part.split(":")[0].isdigit() for part in text.split(",")):
            return {int(p): int(o) for p, o in (part.split(":", 1) for part in text.split(","))}, None
        if text.lstrip("-").isdigit():
            return {-1: int(text)}, None
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
        if moment.tzinfo is None:
            raise click.BadParameter(f"{text!r}: give a time zone (e.g. Z or +02:00)", param_hint=what)
        return {}, int(moment.timestamp() * 1000)
    except ValueError as exc:
        raise click.BadParameter(
            f"{text!r} is not an offset, partition:offset list, ISO time or @milliseconds", param_hint=what
        ) from exc


def job_failure(exc: BaseException) -> str | None:
    """The reader's own error inside a failed Spark job (the executor's Python exception), if any."""
    found = re.findall(r"(?:reader|tiering_core)\.[\w.]+\.(\w+): (.+)", str(exc))
    return f"{found[-1][0]}: {found[-1][1]}" if found else None


def _progress_until(spark: object, done: threading.Event) -> None:
    """A progress bar over the job's tasks, from Spark's status tracker, until ``done``."""
    tracker = spark.sparkContext.statusTracker()  # type: ignore[attr-defined]
    with Progress(TextColumn("exporting"), BarColumn(), TextColumn("{task.completed}/{task.total} segment slices"),
                  TimeElapsedColumn(), console=console, transient=True) as progress:  # fmt: skip
        bar = progress.add_task("export", total=None)
        while not done.wait(0.5):
            stages = [tracker.getStageInfo(s) for s in tracker.getActiveStageIds()]
            stages = [s for s in stages if s is not None]
            if stages:
                progress.update(bar, total=sum(s.numTasks for s in stages),
                                completed=sum(s.numCompletedTasks for s in stages))  # fmt: skip


@click.command("export")
@click.argument("topic")
@click.option("--format", "fmt", type=click.Choice(["parquet", "delta", "iceberg"]), default="parquet",
              show_default=True, help="Output table format.")  # fmt: skip
@click.option("--path", "path", required=True, help="Output directory (local path or a URI Spark and pyarrow "
              "know); for iceberg the table's identifier, namespace.table.")  # fmt: skip
@click.option("--catalog", metavar="NAME", help="iceberg: the catalog, configured as pyiceberg names them "
              "(~/.pyiceberg.yaml or PYICEBERG_CATALOG__NAME__URI ...: a SQL catalog, a REST catalog).")  # fmt: skip
@click.option("--from", "from_", metavar="POSITION", help="Start (inclusive): offset, p:offset,..., ISO time or @ms.")
@click.option("--to", "to", metavar="POSITION", help="End (exclusive): offset, p:offset,..., ISO time or @ms.")
@click.option("--incremental", is_flag=True, help="Export only what was tiered since the last run, exactly once.")
@click.option(
    "--value-format",
    type=click.Choice(["binary", "json", "avro", "json-schema", "protobuf", "auto"]),
    default="binary",
    show_default=True,
    help="json: also flatten JSON values into columns (_corrupt says why a value gave none). avro, json-schema, "
    "protobuf: values in the schema registry's wire format as typed columns, by the subject's schemas "
    "(settings: schema_registry); a value that does not decode keeps its bytes in _corrupt, the reason in "
    "_error. auto: the format of the subject's schemas.",
)
@click.option("--value-subject", metavar="SUBJECT", help="avro, json-schema, protobuf, auto: the values' "
              "registry subject [default: TOPIC-value].")  # fmt: skip
@click.option("--value-message", metavar="NAME", help="protobuf: the message type whose fields become the "
              "columns (package.Message) [default: the first in the subject's newest schema].")  # fmt: skip
@click.option(
    "--key-format",
    type=click.Choice(["binary", "avro", "json-schema", "protobuf", "auto"]),
    default="binary",
    show_default=True,
    help="avro, json-schema, protobuf, auto: keys in the schema registry's wire format as columns key_<field> (a key "
    "that is not a record, e.g. a string, stays one typed key column); _key_corrupt and _key_error as for "
    "values.",
)
@click.option("--key-subject", metavar="SUBJECT",
              help="avro, json-schema, protobuf, auto: the keys' registry subject [default: TOPIC-key].")  # fmt: skip
@click.option("--key-message", metavar="NAME", help="protobuf: the keys' message type, as --value-message.")
@click.option("--json-schema", metavar="DDL", help="Schema of JSON values (e.g. 'order long, note string'); "
              "inferred from a sample when absent.")  # fmt: skip
@click.option("--include-local-tail", is_flag=True,
              help="Also read what is not tiered yet from the broker (read_committed), so the export covers the "
              "whole topic up to its last stable offset.")  # fmt: skip
@click.option("--master", default="local[*]", show_default=True, help="Spark master URL (spark://host:7077, ...).")
@click.option("--conf", "confs", multiple=True, metavar="KEY=VALUE", help="Extra Spark configuration (repeatable).")
@click.option("--show", type=click.IntRange(0, 1000), default=0, help="Print this many exported rows at the end.")
@click.option("--timeout", type=click.FloatRange(min=0.5), default=DEFAULT_TIMEOUT_SECONDS, show_default=True,
              metavar="SECONDS", help="How long the Kafka cluster may take to answer the driver's first metadata "
              "request; past it the export exits 1, before Spark starts.")  # fmt: skip
@config_option
def export(topic: str, fmt: str, path: str, catalog: str | None, from_: str | None, to: str | None,
           incremental: bool, value_format: str, value_subject: str | None, value_message: str | None,
           key_format: str, key_subject: str | None, key_message: str | None, json_schema: str | None,
           include_local_tail: bool, master: str, confs: tuple[str, ...], show: int, config_file: Path | None,
           timeout: float) -> None:  # fmt: skip
    """Export TOPIC's tiered segments to Parquet, Delta or Iceberg with Spark, reading them from the object store.

    No broker data is read (unless --include-local-tail): the segments come from the remote store of the
    sidecar configuration (--config); the driver reads the tiering metadata from its Kafka cluster for the
    log start offsets users set with kafka-delete-records, and leaves the records below them out. Output
    is partitioned by topic partition and UTC date, with Spark's Kafka source columns (key, value, topic,
    partition, offset, timestamp, timestampType, headers). Only committed
    records are exported: aborted transactions and control markers are dropped. With --incremental a
    run starts after the last committed run (Delta: idempotent commit keyed by the offset ranges;
    Parquet: a commit marker written last; Iceberg: the offsets in the run's snapshot summary), so
    re-running never duplicates rows. Prints one JSON line
    with the ranges and row count.
    """
    settings = settings_from(config_file)
    starting, start_ts = parse_position(from_, "--from")
    ending, end_ts = parse_position(to, "--to")
    conf = {}
    for item in confs:
        key, sep, value = item.partition("=")
        if not sep:
            raise click.BadParameter(f"{item!r} is not KEY=VALUE", param_hint="--conf")
        conf[key] = value
    if fmt == "iceberg" and not catalog:
        raise click.BadParameter("an Iceberg export needs the catalog's name", param_hint="--catalog")
    if "://" not in path and fmt != "iceberg":
        path = os.path.abspath(path)

    from reader.spark.export import ExportRequest, nothing_new, planned_ranges, run_export
    from reader.spark.registry_protobuf import message_type
    from reader.spark.session import export_session
    from tiering_core.spark_jars import spark_jars

    asked = {"value": (value_format, value_subject), "key": (key_format, key_subject)}
    subjects = {what: subject or f"{topic}-{what}" for what, (form, subject) in asked.items()
                if form in (*DECODED_FORMATS, "auto")}  # fmt: skip
    schemas = dict(zip(subjects, registry_versions(settings, list(subjects.values()), timeout), strict=True))
    messages = {"value": value_message, "key": key_message}
    try:
        formats = {what: export_format(subjects[what], schemas[what], asked[what][0]) for what in subjects}
        for what, message in messages.items():
            if formats.get(what) == "protobuf":
                message_type(subjects[what], list(schemas[what]), message)  # compiles, before Spark starts
            elif message is not None:
                raise ConfigError(f"--{what}-message is for protobuf {what}s")
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from exc
    value_format, key_format = formats.get("value", value_format), formats.get("key", key_format)
    request = ExportRequest(
        topic=topic, format=fmt, path=path, store=settings.remote_storage,  # type: ignore[arg-type]
        starting=starting, ending=ending, starting_timestamp=start_ts, ending_timestamp=end_ts,
        incremental=incremental, value_format=value_format, json_schema=json_schema,  # type: ignore[arg-type]
        local_tail_bootstrap=settings.bootstrap_servers if include_local_tail else None,
        local_tail_client=client_properties(settings.kafka_client) if include_local_tail else {},
        log_starts=user_log_starts(config_file, topic, timeout),
        value_subject=value_subject, value_schemas=schemas.get("value", ()), value_message=value_message,
        key_format=key_format, key_subject=key_subject, key_schemas=schemas.get("key", ()),  # type: ignore[arg-type]
        key_message=key_message,
        catalog=catalog,
    )  # fmt: skip
    try:
        planned_ranges(request, {})  # bad options, unknown topic, deleted offsets: all before Spark starts
        if fmt == "iceberg":
            iceberg_catalog(catalog or "")
        idle = nothing_new(request)
        if idle is not None:
            click.echo(json.dumps(_summary(request, idle)))
            return
        spark = export_session(master, spark_jars(), conf=conf)
    except (TieringError, RemoteStoreError) as exc:
        raise click.ClickException(str(exc)) from exc
    done = threading.Event()
    bar = threading.Thread(target=_progress_until, args=(spark, done), daemon=True)
    bar.start()
    try:
        result = run_export(spark, request)
    except (TieringError, RemoteStoreError) as exc:
        raise click.ClickException(str(exc)) from exc
    except Exception as exc:
        cause = job_failure(exc)
        if cause is None:
            raise
        raise click.ClickException(f"the export job failed, nothing was committed: {cause}") from exc
    finally:
        done.set()
        bar.join()
    if show and fmt != "iceberg":
        reader = spark.read.format("delta") if fmt == "delta" else spark.read
        reader.load(path).orderBy("partition", "offset").limit(show).show(show, truncate=40)
    click.echo(json.dumps(_summary(request, result)))


def _summary(request: ExportRequest, result: ExportResult) -> dict[str, Any]:
    """The one JSON line an export prints: what it exported (ranges: first and last offset, inclusive)."""
    return {
        "topic": request.topic, "format": request.format, "path": request.path, "rows": result.rows,
        "committed": result.committed, "run": result.run_id,
        "ranges": {str(r.partition): [r.first, r.last] for r in result.ranges if r.last >= r.first},
    }  # fmt: skip
