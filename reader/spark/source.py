"""The PySpark data source ``kafka_tiered``: Kafka topics read from their tiered segments in object storage.

``spark.read.format("kafka_tiered").option("subscribe", "orders").option("store.bucket", ...).load()``
gives Spark's Kafka source schema. The driver lists the remote copies and plans one input partition
per segment (large ones split at batch boundaries, consecutive small ones packed); each executor
reads its segment bytes from the store itself, on the read core every remote reader shares
(``reader.spark.slices``), and yields Arrow RecordBatches. No broker is
involved. Committed data only: control batches and aborted transactions are dropped, and the read
ends at the remote data's stable end.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from dataclasses import replace

import pyarrow as pa
from pyspark.sql import SparkSession
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from reader.listing import RemotePartition, list_remote_partitions
from reader.spark.broker_tail import BrokerSlice, read_broker_slice, tail_slices, with_local_tails
from reader.spark.columns import SPARK_SCHEMA
from reader.spark.options import ReadOptions, parse_options
from reader.spark.planning import PartitionRange, plan_reader, plan_slices, resolve_range
from reader.spark.slices import SlicePack, pack_slices, read_slices, slice_reader
from tiering_core.kafka_cluster import KafkaCluster
from tiering_core.stores.factory import open_store
from tiering_core.stores.prefixed import PrefixedStore

NAME = "kafka_tiered"
_stores: dict[str, PrefixedStore] = {}
_stores_lock = threading.Lock()


def shared_store(opts: ReadOptions) -> PrefixedStore:
    """One store client per configuration and process (Python workers are reused across tasks)."""
    key = opts.store.model_dump_json()
    with _stores_lock:
        if key not in _stores:
            _stores[key] = open_store(opts.store)
        return _stores[key]


def plan(opts: ReadOptions, store: PrefixedStore) -> tuple[list[RemotePartition], list[PartitionRange]]:
    """The remote partitions the options select and the offset range read from each (with
    ``includeLocalTail``, ranges go on to the broker's last stable offset; a partition with no remote
    copy yet has no copies and its whole range is the broker's).

    Raises UnknownTopic, OffsetOutOfRange, BrokerTailError or KafkaClusterError, all before any Spark
    work starts.
    """
    found = list_remote_partitions(store, opts.topics, opts.pattern, opts.topic_ids,
                                   require=not opts.include_local_tail)  # fmt: skip
    # a partition whose every remote record a user deleted has nothing remote to read
    kept = (_above_log_start(rp, opts.log_starts.get(rp.topic_id, {}).get(rp.partition, -1)) for rp in found)
    partitions = [rp for rp in kept if rp.copies and opts.wanted(rp.topic, rp.partition)]
    ranges = []
    with plan_reader(store, partitions) as reader:
        for rp in partitions:
            start = (opts.starting or {}).get(rp.topic, {}).get(rp.partition)
            end = (opts.ending or {}).get(rp.topic, {}).get(rp.partition)
            ranges.append(resolve_range(reader, rp, start, end, opts.starting_timestamp, opts.ending_timestamp,
                                        fail_on_data_loss=opts.fail_on_data_loss))  # fmt: skip
    if not opts.include_local_tail:
        return partitions, ranges
    topics = opts.topics or sorted({rp.topic for rp in found})
    client = {name: value for name, value in opts.kafka.items() if name != "bootstrap.servers"}  # security...
    cluster = KafkaCluster(opts.kafka["bootstrap.servers"], client_config=client)
    known = {(rp.topic, rp.partition): rp for rp in partitions}
    starting = opts.starting or {}
    aligned, extended = [], []
    for rng in with_local_tails(cluster, topics, ranges, opts.ending or {}):
        if not opts.wanted(rng.topic, rng.partition):
            continue
        rp = known.get((rng.topic, rng.partition))
        if rp is None:  # no remote copy yet: all of it from the broker, from the requested start
            rp = RemotePartition(rng.topic, rng.topic_id, rng.partition, ())
            rng = replace(rng, first=max(rng.first, starting.get(rng.topic, {}).get(rng.partition, rng.first)))
        aligned.append(rp)
        extended.append(rng)
    return aligned, extended


def _above_log_start(rp: RemotePartition, log_start: int) -> RemotePartition:
    """The partition's copies from ``log_start`` on (records below a user's log start are deleted)."""
    if not rp.copies or log_start <= rp.copies[0].first:
        return rp
    copies = tuple(replace(c, first=max(c.first, log_start)) for c in rp.copies if c.last >= log_start)
    return replace(rp, copies=copies)


class TieredReader(DataSourceReader):
    def __init__(self, opts: ReadOptions) -> None:
        self.opts = opts

    def partitions(self) -> Sequence[InputPartition]:
        store = shared_store(self.opts)
        partitions, ranges = plan(self.opts, store)
        with plan_reader(store, partitions) as reader:
            slices = plan_slices(reader, partitions, ranges, self.opts.max_slice_bytes)
        packs: list[InputPartition] = list(pack_slices(slices, self.opts.max_slice_bytes))
        if self.opts.include_local_tail:
            packs.extend(tail_slices(ranges, self.opts.kafka))
        return packs

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if isinstance(partition, BrokerSlice):
            yield from read_broker_slice(partition, self.opts.max_rows_per_batch)
            return
        assert isinstance(partition, SlicePack)
        with slice_reader(shared_store(self.opts), [partition.remote_partition()], self.opts.window_bytes) as reader:
            yield from read_slices(reader, partition.slices, max_rows=self.opts.max_rows_per_batch)


class KafkaTieredDataSource(DataSource):
    """``format("kafka_tiered")``; options are described in ``reader.spark.options``."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> str:
        parse_options(self.options)  # bad options fail at load(), before any planning or job
        return SPARK_SCHEMA

    def reader(self, schema: object) -> DataSourceReader:
        return TieredReader(parse_options(self.options))


def register(spark: SparkSession) -> None:
    """Make ``spark.read.format("kafka_tiered")`` available in this session (idempotent)."""
    spark.dataSource.register(KafkaTieredDataSource)
