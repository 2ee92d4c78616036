"""The export job: a topic's tiered data to Parquet, Delta or Iceberg, exactly once per offset range.

Everything that can be wrong with the request (options, an unknown topic, an offset retention has
deleted) is checked on the driver before Spark starts any work: the plan is made here and handed to
the data source as explicit offsets, so the job reads exactly the planned ranges.

Output is partitioned by topic partition and UTC date. Incremental runs start after what the output
already holds:
- Delta: the ranges of the last run are in its commit (``userMetadata``); the write is idempotent
  (``txnAppId`` derived from the topic and the run's offset ranges), so a repeated run of the same
  ranges, even concurrent, commits nothing. A failed job leaves no commit.
- Parquet: a commit marker written last (``parquet_commit``).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Literal

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StringType, StructField, StructType

from reader.listing import list_remote_partitions
from reader.spark.iceberg_output import IcebergOutput
from reader.spark.jvm_source import load
from reader.spark.options import parse_options, store_options
from reader.spark.parquet_commit import ParquetOutput, new_run_id
from reader.spark.planning import PartitionRange
from reader.spark.registry_avro import decode_registry_avro
from reader.spark.registry_json import decode_registry_json
from reader.spark.registry_protobuf import decode_registry_protobuf
from reader.spark.source import plan, shared_store
from tiering_core.crash_points import crash_point
from tiering_core.errors import ConfigError
from tiering_core.logs import get_logger
from tiering_core.schema_registry import RegisteredSchema
from tiering_core.stores.config import AnyStoreConfig

log = get_logger(__name__)
KAFKA_COLUMNS = ("key", "value", "topic", "partition", "offset", "timestamp", "timestampType", "headers")
# the schema registry's formats: how a column of each becomes typed columns
REGISTRY_FORMATS = {"avro": decode_registry_avro, "json-schema": decode_registry_json,
                    "protobuf": decode_registry_protobuf}  # fmt: skip
APP_PREFIX = "kafka_tiered"
EVERY_PARTITION = -1
NOT_UTF8 = "value is not UTF-8 text"  # _corrupt: why a value gave no JSON fields (the raw bytes stay in value)
NOT_JSON = "value is not a JSON object of the schema"


@dataclass(frozen=True)
class ExportRequest:
    topic: str
    format: Literal["parquet", "delta", "iceberg"]
    path: str
    store: AnyStoreConfig
    starting: dict[int, int] = field(default_factory=dict)  # partition -> first offset (inclusive); -1: all
    ending: dict[int, int] = field(default_factory=dict)  # partition -> end offset (exclusive); -1: all
    starting_timestamp: int | None = None
    ending_timestamp: int | None = None
    incremental: bool = False
    value_format: Literal["binary", "json", "avro", "json-schema", "protobuf"] = "binary"
    json_schema: str | None = None  # DDL; inferred from a sample when None
    # avro, json-schema, protobuf: the registry subject of the values (default <topic>-value) and its versions,
    # read on the driver
    value_subject: str | None = None
    value_schemas: tuple[RegisteredSchema, ...] = ()
    value_message: str | None = None  # protobuf: the message type exported (default: the schema's first)
    key_format: Literal["binary", "avro", "json-schema", "protobuf"] = "binary"
    key_subject: str | None = None  # the registry subject of the keys (default <topic>-key)
    key_schemas: tuple[RegisteredSchema, ...] = ()
    key_message: str | None = None
    catalog: str | None = None  # iceberg: the pyiceberg catalog's name (path is then the table's identifier)
    catalog_properties: dict[str, str] = field(default_factory=dict)  # iceberg: beside pyiceberg's own config
    local_tail_bootstrap: str | None = None  # set: also read the untiered tail from these brokers
    local_tail_client: dict[str, str] = field(default_factory=dict)  # their librdkafka properties (security...)
    # topic id -> partition -> a user's delete_records log start (recorded by the sidecar): records below are
    # left out, as for every other reader
    log_starts: dict[str, dict[int, int]] = field(default_factory=dict)


@dataclass(frozen=True)
class ExportResult:
    ranges: list[PartitionRange]
    rows: int
    committed: bool  # False: nothing new to export (or the same ranges were already committed)
    run_id: str | None = None


def planned_ranges(request: ExportRequest, previous: dict[int, int]) -> list[PartitionRange]:
    """The ranges this run exports (``previous``: last offset already exported per partition)."""
    store = shared_store(parse_options({"subscribe": request.topic, **store_options(request.store)}))
    starting, ending = dict(request.starting), dict(request.ending)
    if EVERY_PARTITION in starting or EVERY_PARTITION in ending:
        numbers = [rp.partition for rp in list_remote_partitions(store, [request.topic])]
        starting, ending = _expand(starting, numbers), _expand(ending, numbers)
    for partition, last in previous.items():
        starting[partition] = max(starting.get(partition, -2), last + 1)
    options = {
        "subscribe": request.topic,
        **store_options(request.store),
        **_offsets_option("startingOffsets", request.topic, starting),
        **_offsets_option("endingOffsets", request.topic, ending),
    }
    if request.starting_timestamp is not None:
        options["startingTimestamp"] = str(request.starting_timestamp)
    if request.ending_timestamp is not None:
        options["endingTimestamp"] = str(request.ending_timestamp)
    _, ranges = plan(parse_options({**options, **_tail_options(request), **_log_start_options(request)}), store)
    return ranges


def _registry_decoder(fmt: str, message: str | None) -> Callable[..., DataFrame]:
    decode = REGISTRY_FORMATS[fmt]
    return partial(decode_registry_protobuf, message=message) if fmt == "protobuf" else decode


def _expand(offsets: dict[int, int], partitions: list[int]) -> dict[int, int]:
    if EVERY_PARTITION not in offsets:
        return offsets
    return {p: offsets.get(p, offsets[EVERY_PARTITION]) for p in partitions}


def _outputs(request: ExportRequest) -> tuple[ParquetOutput | None, IcebergOutput | None]:
    if request.format == "parquet":
        return ParquetOutput(request.path, request.topic), None
    if request.format == "iceberg":
        return None, IcebergOutput(request.catalog or "", request.path, request.topic, request.catalog_properties)
    return None, None


def nothing_new(request: ExportRequest) -> ExportResult | None:
    """The result of an incremental Parquet or Iceberg run that finds nothing new to export, known without Spark
    (their committed offsets are in the commit markers and the snapshot summaries, read with pyarrow's and
    pyiceberg's file systems): a scheduled run then takes seconds instead of a Spark start. None: there is
    something to export, or it takes Spark to tell (Delta's commits are read through Spark)."""
    parquet, iceberg = _outputs(request)
    output = parquet or iceberg
    if not request.incremental or output is None:
        return None
    ranges = planned_ranges(request, output.committed_ends())
    return None if any(r.last >= r.first for r in ranges) else ExportResult(ranges, 0, False)


def run_export(spark: SparkSession, request: ExportRequest) -> ExportResult:
    """Run one export. Raises before any Spark work for bad input; a failed job commits nothing."""
    if request.value_format in REGISTRY_FORMATS and not request.value_schemas:
        raise ConfigError(f"no schema of subject {request.value_subject or request.topic + '-value'} in the registry")
    if request.key_format in REGISTRY_FORMATS and not request.key_schemas:
        raise ConfigError(f"no schema of subject {request.key_subject or request.topic + '-key'} in the registry")
    if request.format not in ("parquet", "delta", "iceberg"):
        raise ConfigError(f"unknown export format {request.format!r}: parquet, delta or iceberg")
    if request.format == "iceberg" and not request.catalog:
        raise ConfigError("an Iceberg export needs the catalog's name (--catalog) and the table as --path ns.table")
    parquet, iceberg = _outputs(request)
    output = parquet or iceberg  # the formats whose commits this module keeps (Delta keeps its own)
    if output is not None:
        removed = output.remove_uncommitted()
        if removed:
            log.warning("removed files of an export run that never committed", path=request.path, files=len(removed))
    previous: dict[int, int] = {}
    if request.incremental:
        previous = output.committed_ends() if output is not None else _delta_committed_ends(spark, request)
    ranges = planned_ranges(request, previous)
    wanted = [r for r in ranges if r.last >= r.first]
    if not wanted:
        return ExportResult(ranges, 0, False)
    df = _frame(spark, request, wanted)
    if request.value_format == "json":
        df = flatten_json(spark, df, request.json_schema)
    if request.key_format in REGISTRY_FORMATS:  # key fields as key_<field>, a scalar key typed in place
        df = _registry_decoder(request.key_format, request.key_message)(
            df,
            "key",
            request.key_subject or f"{request.topic}-key",
            list(request.key_schemas),
            set(df.columns),
            prefix="key_",
            corrupt="_key_corrupt",
            error_column="_key_error",
        )
    if request.value_format in REGISTRY_FORMATS:
        subject = request.value_subject or f"{request.topic}-value"
        df = _registry_decoder(request.value_format, request.value_message)(
            df, "value", subject, list(request.value_schemas), {*KAFKA_COLUMNS, *df.columns})  # fmt: skip
    ranges_json = {str(r.partition): [r.first, r.last] for r in wanted}
    topic_id = wanted[0].topic_id
    if iceberg is not None:
        return _write_iceberg(spark, df, iceberg, topic_id, ranges, wanted)
    if parquet is not None:
        run_id = new_run_id()
        try:
            df.write.mode("error").partitionBy("partition", "date").parquet(_spark_path(parquet.staging(run_id)))
            marker = parquet.commit(run_id, topic_id, {r.partition: (r.first, r.last) for r in wanted})
        except BaseException:
            parquet.remove_uncommitted()
            raise
        return ExportResult(ranges, marker.rows, True, run_id)
    return _write_delta(spark, df, request, topic_id, ranges, ranges_json)


def _frame(spark: SparkSession, request: ExportRequest, wanted: list[PartitionRange]) -> DataFrame:
    options = {
        "assign": json.dumps({request.topic: [r.partition for r in wanted]}),
        "topicIds": json.dumps({request.topic: wanted[0].topic_id}),
        **store_options(request.store),
        **_offsets_option("startingOffsets", request.topic, {r.partition: r.first for r in wanted}),
        **_offsets_option("endingOffsets", request.topic, {r.partition: r.last + 1 for r in wanted}),
        **_tail_options(request),
        **_log_start_options(request),
    }
    df = load(spark, options)
    return df.withColumn("date", utc_date(F.col("timestamp")))


def utc_date(ts: Column) -> Column:
    """The UTC calendar date of a timestamp, whatever the session's time zone."""
    return F.date_from_unix_date(F.floor(F.unix_micros(ts) / F.lit(86_400_000_000)).cast("int"))


def flatten_json(spark: SparkSession, df: DataFrame, schema_ddl: str | None) -> DataFrame:
    """Add the JSON value's fields as columns, and ``_corrupt``: why a value gave no fields (NOT_UTF8,
    NOT_JSON; null for a JSON object of the schema and for a null value).

    Without a schema, it is inferred from up to 1000 values that look like JSON objects.

    The raw ``value`` (binary) stays, so nothing is lost. Only valid UTF-8 reaches a string column: Spark's
    cast of binary to string keeps any bytes, and Parquet readers other than Spark's (pyarrow, deltalake,
    DuckDB) refuse a string column holding invalid UTF-8, so values that are not UTF-8 are not parsed, and
    ``_corrupt`` holds a reason instead of the value (JSON's own strings decode to valid text). Fields named
    like a Kafka column or ``_corrupt`` get a ``value_`` prefix.
    """
    raw = F.col("value").cast("string")
    utf8 = F.is_valid_utf8(raw)
    text = F.when(utf8, raw)
    if schema_ddl is not None:
        schema = StructType.fromDDL(schema_ddl)
    else:
        objects = df.select(text.alias("v")).where(F.ltrim(F.col("v")).startswith("{"))
        sample = [r[0] for r in objects.limit(1000).collect()]
        schema = (
            spark.read.option("mode", "DROPMALFORMED").json(spark.sparkContext.parallelize(sample)).schema
            if sample
            else StructType()
        )
    fields = [f for f in schema.fields if f.name != "_corrupt_record"]
    malformed = "_malformed"  # from_json's corrupt record column: whatever no field is named
    while malformed in {f.name for f in fields}:
        malformed = f"_{malformed}"
    parse_schema = StructType([*fields, StructField(malformed, StringType())])
    parsed = F.from_json(text, parse_schema, {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": malformed})
    corrupt = (
        F.when(F.col("value").isNull(), F.lit(None))
        .when(~utf8, F.lit(NOT_UTF8))
        .when(parsed.isNull() | parsed[malformed].isNotNull(), F.lit(NOT_JSON))
    )
    taken = {*df.columns, "_corrupt"}
    columns = [parsed[f.name].alias(f"value_{f.name}" if f.name in taken else f.name) for f in fields]
    return df.select(*df.columns, *columns, corrupt.cast(StringType()).alias("_corrupt"))


def _write_iceberg(spark: SparkSession, df: DataFrame, output: IcebergOutput, topic_id: str,
                   ranges: list[PartitionRange], wanted: list[PartitionRange]) -> ExportResult:  # fmt: skip
    """Spark writes the run's files (one Kafka partition and UTC day per file, timestamps in microseconds)
    into a directory of the run's own under the table's location; one pyiceberg snapshot adds them."""
    from pyspark.sql.pandas.types import to_arrow_schema

    rows = df.drop("date")
    table = output.ensure_table(to_arrow_schema(rows.schema, timezone="UTC"))
    run_id = new_run_id()
    previous = spark.conf.get("spark.sql.parquet.outputTimestampType")
    spark.conf.set("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")
    hadoop = spark.sparkContext._jsc.hadoopConfiguration()  # type: ignore[union-attr]
    for key, value in output.hadoop_settings(table).items():
        hadoop.set(key, value)
    target = output.spark_path(output.run_dir(table, run_id))
    try:
        (rows.withColumn("__p", F.col("partition")).withColumn("__d", utc_date(F.col("timestamp")))
         .write.mode("error").partitionBy("__p", "__d").parquet(target))  # fmt: skip
    finally:
        spark.conf.set("spark.sql.parquet.outputTimestampType", previous or "INT96")
    crash_point("export.files_written")
    files, count = output.commit(table, run_id, topic_id, {r.partition: r.last for r in wanted})
    return ExportResult(ranges, count, files > 0, run_id)


def _write_delta(spark: SparkSession, df: DataFrame, request: ExportRequest, topic_id: str,
                 ranges: list[PartitionRange], ranges_json: dict[str, list[int]]) -> ExportResult:  # fmt: skip
    key = json.dumps({"topic": request.topic, "topic_id": topic_id, "ranges": ranges_json}, sort_keys=True)
    app_id = f"{APP_PREFIX}/{request.topic}/{hashlib.sha256(key.encode()).hexdigest()[:32]}"
    metadata = json.dumps({"kafka_tiered": {"topic": request.topic, "topic_id": topic_id, "ranges": ranges_json}})
    before = _delta_version(spark, request.path)
    writer = (
        df.write.format("delta").mode("append").partitionBy("partition", "date")
        .option("txnAppId", app_id).option("txnVersion", "0").option("userMetadata", metadata)
    )  # fmt: skip
    if request.value_format != "binary" or request.key_format != "binary":  # new fields (inferred, a new version)
        writer = writer.option("mergeSchema", "true")
    writer.save(request.path)
    after = _delta_version(spark, request.path)
    if after == before:
        return ExportResult(ranges, 0, False)
    history = spark.sql(f"DESCRIBE HISTORY delta.`{request.path}` LIMIT 1").collect()[0]
    rows = int((history["operationMetrics"] or {}).get("numOutputRows", 0))
    return ExportResult(ranges, rows, True, app_id)


def _delta_version(spark: SparkSession, path: str) -> int | None:
    """The table's latest version, None if there is no Delta table at ``path`` yet."""
    if not spark._jvm.io.delta.tables.DeltaTable.isDeltaTable(spark._jsparkSession, path):
        return None
    return spark.sql(f"DESCRIBE HISTORY delta.`{path}` LIMIT 1").collect()[0]["version"]


def _delta_committed_ends(spark: SparkSession, request: ExportRequest) -> dict[int, int]:
    """Last exported offset per partition: from the runs' commit metadata, else (history cleaned up) from
    the data itself, which can lead to re-reading trailing aborted records or markers, dropped again."""
    if _delta_version(spark, request.path) is None:
        return {}
    ends: dict[int, int] = {}
    for row in spark.sql(f"DESCRIBE HISTORY delta.`{request.path}`").select("userMetadata").collect():
        try:
            meta = json.loads(row[0])["kafka_tiered"] if row[0] else None
        except (ValueError, KeyError, TypeError):
            meta = None
        if meta and meta.get("topic") == request.topic:
            for partition, (_, last) in meta["ranges"].items():
                ends[int(partition)] = max(ends.get(int(partition), -1), int(last))
    if ends:
        return ends
    table = spark.read.format("delta").load(request.path).where(F.col("topic") == request.topic)
    for row in table.groupBy("partition").agg(F.max("offset").alias("last")).collect():
        ends[row["partition"]] = max(ends.get(row["partition"], -1), row["last"])
    return ends


def _tail_options(request: ExportRequest) -> dict[str, str]:
    if request.local_tail_bootstrap is None:
        return {}
    client = {f"kafka.{name}": value for name, value in request.local_tail_client.items()}
    return {"includeLocalTail": "true", "kafka.bootstrap.servers": request.local_tail_bootstrap, **client}


def _offsets_option(name: str, topic: str, offsets: dict[int, int]) -> dict[str, str]:
    if not offsets:
        return {}
    return {name: json.dumps({topic: {str(p): o for p, o in offsets.items()}})}


def _spark_path(path: str) -> str:
    return path if "://" in path else f"file://{path}"


def _log_start_options(request: ExportRequest) -> dict[str, str]:
    return {"logStartOffsets": json.dumps(request.log_starts)} if request.log_starts else {}
