"""``kafka_tiered`` read by the JVM: planned here, on the read core, and read by ``kafka_tiered_slices`` tasks.

A Python data source hands every row to Spark through its Python worker: each Arrow batch is written to the JVM,
which turns it into rows, and no Python source can skip that (a source that only hands over batches it already
holds measured 2.40-2.85x Spark's Kafka source, docs/spark-export.md). So the same plan, made by the same code
(``reader.spark.source.plan``, ``plan_slices``, ``pack_slices``: the copies, the batch-aligned byte ranges, the
aborted transactions), is given as JSON to a DataSource V2 in the JVM (``reader/spark/jvm/``), whose tasks read
each slice's bytes as ranged GETs of 4 MiB windows, three ahead, through a URL the store signed
(``RemoteStore.read_url``: no credentials reach the executors), check every batch as
``reader.spark.slices.decode_slice`` does and fill Spark's column vectors directly.

``load`` picks it when the session has the reader's jar (``reader.spark.session.export_session`` adds it) and
the read needs nothing only the Python source does (``includeLocalTail``: the broker's part is read with a
Python consumer); else it loads ``format("kafka_tiered")``. Both give the same rows, held to it by tests.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping

from pyspark.sql import DataFrame, SparkSession

from reader.spark.options import ReadOptions, parse_options
from reader.spark.planning import plan_reader, plan_slices
from reader.spark.slices import SlicePack, pack_slices
from reader.spark.source import NAME, plan, shared_store
from tiering_core.stores.base import RemoteStore

FORMAT = "kafka_tiered_slices"
# The plan's signed URLs read the objects for hours. Spark does not print a V2 read's options in its plans; should
# anything print them, the name matches spark.sql.redaction.options.regex (default "(?i)url"), which redacts it.
PLAN_OPTION = "planWithSignedUrls"
ENABLED_CONF = "spark.kafka_tiered.jvmReader"  # set by export_session when the jar is on the class path
URL_SECONDS = 6 * 3600  # how long a task may start after planning (S3 allows up to 7 days)
RETRIES = 5  # a window whose GET broke is asked again this many times
WINDOW_BYTES = 4 << 20  # a task reads a slice as ranged GETs of this many bytes ...
WINDOWS_AHEAD = 3  # ... this many in flight while it decodes one: at most 16 MiB of windows per task


def plan_packs(opts: ReadOptions, store: RemoteStore) -> list[SlicePack]:
    """The packs ``format("kafka_tiered")`` would read for ``opts`` (its remote part)."""
    partitions, ranges = plan(opts, store)
    with plan_reader(store, partitions) as reader:
        slices = plan_slices(reader, partitions, ranges, opts.max_slice_bytes)
    return pack_slices(slices, opts.max_slice_bytes)


def plan_json(packs: list[SlicePack], store: RemoteStore, *, max_rows: int, max_bytes: int,
              url_seconds: int = URL_SECONDS) -> str:  # fmt: skip
    """The JVM reader's plan: the packs, each object's URL signed for ``url_seconds``, and the column batches'
    limits (``max_rows`` rows or ``max_bytes`` bytes of keys, values and headers, as the Python source's)."""
    urls: dict[str, str] = {}

    def url(key: str) -> str:  # one signature per object, however many slices it is cut into
        if key not in urls:
            urls[key] = store.read_url(key, url_seconds)
        return urls[key]

    return json.dumps({
        "packs": [_pack(p, url) for p in packs],
        "max_rows_per_batch": max_rows, "max_batch_bytes": max_bytes, "retries": RETRIES,
        "window_bytes": WINDOW_BYTES, "windows_ahead": WINDOWS_AHEAD,
    })  # fmt: skip


def _pack(pack: SlicePack, url: Callable[[str], str]) -> dict[str, object]:
    first = pack.slices[0]
    return {"topic": first.topic, "partition": first.partition, "slices": [{
        "url": url(s.key),
        "key": s.key, "start": s.start, "end": s.end, "first_offset": s.first_offset, "last_offset": s.last_offset,
        "base_offset": s.copy.manifest.base_offset, "end_offset": s.copy.manifest.end_offset,
        "object_size": s.copy.manifest.log_size,
        "object_crc32c": s.copy.manifest.log_crc32c if s.whole else None, "aborted": [list(a) for a in s.aborted],
    } for s in pack.slices]}  # fmt: skip


def jvm_enabled(spark: SparkSession) -> bool:
    return spark.conf.get(ENABLED_CONF, "false") == "true"


def load(spark: SparkSession, options: Mapping[str, str]) -> DataFrame:
    """``spark.read.format("kafka_tiered").options(**options).load()``, read by the JVM reader where it can be."""
    opts = parse_options(options)
    if not jvm_enabled(spark) or opts.include_local_tail:
        return spark.read.format(NAME).options(**options).load()
    store = shared_store(opts)
    packs = plan_packs(opts, store)
    return read_plan(spark, plan_json(packs, store, max_rows=opts.max_rows_per_batch, max_bytes=opts.window_bytes))


def read_plan(spark: SparkSession, plan_json: str) -> DataFrame:
    """The DataFrame of a plan (``plan_json``)."""
    return spark.read.format(FORMAT).option(PLAN_OPTION, plan_json).load()
