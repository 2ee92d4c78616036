"""Iceberg output: Spark writes a run's Parquet files under the table's location, one pyiceberg commit adds them.

Spark 4.2 has no Iceberg runtime (``iceberg-spark-runtime`` stops at Spark 4.1), so Spark writes plain Parquet
and pyiceberg commits it (``add_files``): one snapshot per run, whose summary holds the offsets exported so
far per partition (``kafka-tiered.ends``, with the topic id), so an incremental run continues exactly after
the last committed run. A run killed before its commit added nothing: its files sit in a directory of their
own (``data/kafka-tiered-<run id>``) that no snapshot references, and the next run deletes them.

The table is partitioned by Kafka partition (identity) and by the day of the record timestamp (Iceberg's
``day`` transform): each file holds one partition's records of one UTC day (Spark partitions the write by
both), so ``add_files`` reads both from the file's own statistics. Timestamps are written as microseconds
(Iceberg's type; Spark's default INT96 is not one). A later run that brings new columns (a new schema version)
adds them to the table schema first.

A warehouse on S3 (``s3://``) is written by Spark through Hadoop's S3 filesystem (``s3a://``, the same objects;
hadoop-aws is among the export's jars), configured for the table's bucket only from the catalog's own S3
properties as pyiceberg names them (``s3.endpoint``, ``s3.access-key-id``, ``s3.secret-access-key``,
``s3.session-token``, ``s3.region``, ``s3.path-style-access``); without keys Hadoop's default credential chain
applies (environment, instance profile). The run's files are listed and removed through the table's own FileIO.
"""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa
from pyarrow import fs as pafs

SUMMARY_KEY = "kafka-tiered.ends"
RUN_PREFIX = "kafka-tiered-"
# pyiceberg's S3 properties -> Hadoop's s3a options (set per bucket: fs.s3a.bucket.<bucket>.<option>)
_S3A = {"s3.endpoint": "endpoint", "s3.access-key-id": "access.key", "s3.secret-access-key": "secret.key",
        "s3.session-token": "session.token", "s3.region": "endpoint.region",
        "s3.path-style-access": "path.style.access"}  # fmt: skip


class IcebergOutput:
    """One Iceberg table of a catalog configured as pyiceberg names them (``~/.pyiceberg.yaml``,
    ``PYICEBERG_CATALOG__<NAME>__...``), or with ``properties`` given here."""

    def __init__(self, catalog: str, identifier: str, topic: str, properties: dict[str, str] | None = None) -> None:
        from pyiceberg.catalog import load_catalog

        self.catalog = load_catalog(catalog, **(properties or {}))
        self.identifier = identifier
        self.topic = topic

    def table(self) -> Any:
        from pyiceberg.exceptions import NoSuchTableError

        try:
            return self.catalog.load_table(self.identifier)
        except NoSuchTableError:
            return None

    def ensure_table(self, schema: pa.Schema) -> Any:
        """The table (created with ``schema`` and the partitioning on the first run; new columns added)."""
        from pyiceberg.transforms import DayTransform, IdentityTransform

        table = self.table()
        if table is None:
            namespace = self.identifier.rsplit(".", 1)[0]
            self.catalog.create_namespace_if_not_exists(namespace)
            table = self.catalog.create_table(self.identifier, schema=schema)
            with table.update_spec() as spec:
                spec.add_field("partition", IdentityTransform(), "partition")
                spec.add_field("timestamp", DayTransform(), "timestamp_day")
            return self.catalog.load_table(self.identifier)
        with table.update_schema() as update:
            update.union_by_name(schema)
        return self.catalog.load_table(self.identifier)

    def committed_ends(self) -> dict[int, int]:
        """The last exported offset per partition, from the newest snapshot of ours in the current lineage."""
        table = self.table()
        snapshot = table.current_snapshot() if table is not None else None
        while snapshot is not None:
            summary = snapshot.summary.additional_properties if snapshot.summary is not None else {}
            ours = json.loads(summary[SUMMARY_KEY]) if SUMMARY_KEY in summary else None
            if ours is not None and ours.get("topic") == self.topic:
                return {int(p): int(o) for p, o in ours["ends"].items()}
            snapshot = table.snapshot_by_id(snapshot.parent_snapshot_id) if snapshot.parent_snapshot_id else None
        return {}

    def run_dir(self, table: Any, run_id: str) -> str:
        return f"{table.location().rstrip('/')}/data/{RUN_PREFIX}{run_id}"

    def spark_path(self, uri: str) -> str:
        """Where Spark writes ``uri``: an S3 location through Hadoop's s3a filesystem."""
        return "s3a://" + uri.removeprefix("s3://") if uri.startswith("s3://") else uri

    def hadoop_settings(self, table: Any) -> dict[str, str]:
        """Hadoop's options for writing under the table's location: for S3, the catalog's endpoint, keys, region
        and path style, for that bucket only."""
        location = table.location()
        if not location.startswith("s3://"):
            return {}
        bucket = location.removeprefix("s3://").split("/", 1)[0]
        properties = table.io.properties
        out = {f"fs.s3a.bucket.{bucket}.{option}": str(properties[name]) for name, option in _S3A.items()
               if properties.get(name) is not None}  # fmt: skip
        if properties.get("s3.access-key-id"):
            provider = "Temporary" if properties.get("s3.session-token") else "Simple"
            out[f"fs.s3a.bucket.{bucket}.aws.credentials.provider"] = (
                f"org.apache.hadoop.fs.s3a.{provider}AWSCredentialsProvider")  # fmt: skip
        return out

    def commit(self, table: Any, run_id: str, topic_id: str, ends: dict[int, int]) -> tuple[int, int]:
        """Add the run's files in one snapshot with the offsets exported so far; (files, rows) added."""
        fs, root = _filesystem(table, self.run_dir(table, run_id))
        files = [f"{_scheme(table.location())}{info.path}" for info in fs.get_file_info(pafs.FileSelector(root,
                 recursive=True)) if info.is_file and info.base_name.endswith(".parquet")]  # fmt: skip
        if not files:
            return 0, 0
        merged = self.committed_ends()  # the highest offset per partition over every run, as the Parquet markers
        for partition, last in ends.items():
            merged[partition] = max(merged.get(partition, -1), last)
        ends_json = {str(p): o for p, o in merged.items()}
        summary = json.dumps({"topic": self.topic, "topic_id": topic_id, "ends": ends_json})
        table.add_files(files, snapshot_properties={SUMMARY_KEY: summary})
        added = self.catalog.load_table(self.identifier).current_snapshot().summary.additional_properties
        return len(files), int(added.get("added-records", 0))

    def remove_uncommitted(self) -> list[str]:
        """Delete the run directories no snapshot references (runs killed before their commit)."""
        table = self.table()
        if table is None:
            return []
        referenced = {part for path in _data_files(table) for part in path.split("/") if part.startswith(RUN_PREFIX)}
        fs, data = _filesystem(table, f"{table.location().rstrip('/')}/data")
        removed = []
        for info in fs.get_file_info(pafs.FileSelector(data, allow_not_found=True)):
            name = info.base_name
            if info.type == pafs.FileType.Directory and name.startswith(RUN_PREFIX) and name not in referenced:
                fs.delete_dir(info.path)
                removed.append(info.path)
        return removed


def _data_files(table: Any) -> list[str]:
    """Every data file the current snapshot references."""
    if table.current_snapshot() is None:
        return []
    return [task.file.file_path for task in table.scan().plan_files()]


def _filesystem(table: Any, uri: str) -> tuple[pafs.FileSystem, str]:
    """The table's own filesystem for ``uri`` (its FileIO's: the catalog's S3 settings) and the path in it."""
    io = table.io
    by_scheme = getattr(io, "fs_by_scheme", None)
    if by_scheme is None:  # not pyiceberg's pyarrow FileIO: pyarrow's defaults
        return pafs.FileSystem.from_uri(uri)
    scheme, netloc, path = io.parse_location(uri)
    return by_scheme(scheme, netloc), path


def _scheme(location: str) -> str:
    return location.split("://", 1)[0] + "://" if "://" in location else ""
