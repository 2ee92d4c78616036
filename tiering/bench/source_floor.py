"""The floor of Spark's Python data source path, for ``tiering bench export``.

``kafka_tiered`` is a Python data source (``pyspark.sql.datasource``): whatever it does, every row then
goes through Spark's part of that path. Spark writes each Arrow batch the reader yields from the Python
worker to the JVM, which turns it into rows (``PythonPartitionReaderFactory``: row reads only, no columnar
reads). ``format("tiering_bench_floor")`` is a Python data source that does nothing else: it yields the
same rows as ``kafka_tiered``, already decoded, as Arrow batches from a memory-mapped IPC file (one file
per input partition, as ``kafka_tiered`` plans one task per Kafka partition here; as many rows per batch as
``kafka_tiered`` yields). Its speed is what a Python data source reaches in that session when it only hands
over batches, so its ratio to Spark's Kafka source bounds ``source_ratio``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from reader.spark.columns import SPARK_SCHEMA

NAME = "tiering_bench_floor"


def write_floor(path: Path, batches: Iterator[pa.RecordBatch]) -> int:
    """Write ``batches`` to the IPC file ``path``; the rows written."""
    rows, writer = 0, None
    try:
        for batch in batches:
            writer = writer or pa.ipc.new_file(str(path), batch.schema)
            writer.write_batch(batch)
            rows += batch.num_rows
    finally:
        if writer is not None:
            writer.close()
    return rows


class _FloorReader(DataSourceReader):
    def __init__(self, paths: Sequence[str]) -> None:
        self.paths = paths

    def partitions(self) -> Sequence[InputPartition]:
        return [InputPartition(path) for path in self.paths]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        with pa.memory_map(partition.value) as source:
            batches = pa.ipc.open_file(source)
            for i in range(batches.num_record_batches):
                yield batches.get_batch(i)


class FloorSource(DataSource):
    """``format("tiering_bench_floor")``, option ``paths``: the IPC files, comma-separated, one per task."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> str:
        return SPARK_SCHEMA

    def reader(self, schema: object) -> DataSourceReader:
        return _FloorReader(self.options["paths"].split(","))
