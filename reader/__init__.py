"""Reading tiered data back: the remote copies of segments, and a consumer that hands over to the broker.

The API, in the order a reader uses it:

- ``ReaderSettings`` / ``load_reader_settings(file)``: configuration (pydantic-settings, ``TIERING_*``
  env vars; a sidecar's configuration file works as it is).
- ``MetadataCatalog``: the tiering metadata without a sidecar (snapshots + the WAL partitions of the
  watched topics, followed): topic ids, finished copies, the copy holding an offset, Rx/Ry.
- ``RemoteReader``: ``locate`` a copy (``SegmentCopy``: manifest, offset index, aborted
  transactions), ``read_range`` of a copy's ``.log``.
- ``ReadAhead`` (``reader.readahead``): the read core under the two below: a sequential reader's windows,
  read ahead into the memory pool (hard byte cap, evictable), the next copy located ahead.
- ``CursorCache(reader, capacity, memory_wait).read(topic, topic_id, partition, offset, max_bytes,
  read_committed)``: whole verified record batches (raw bytes as Kafka wrote them) from the offset on,
  read ahead for the next read at the offset the last one ended (``reader.cursor``).
- ``PartitionStream(reader, topic, partition, offset)``: sequential decoded reads, read_committed filtering.
- ``HotDataPreloader``: started by ``RemoteReader`` when ``hot_data_interval_seconds`` is set; warms the
  disk cache for consumer groups' committed offsets below the broker's log start while idle.
- ``TieredConsumer``: ``confluent_kafka.Consumer``'s interface; offsets below the broker's log start
  come from the remote copies, then it hands over to the broker with no gap and no duplicate;
  ``describe()`` says what it is doing (for a reader that stopped delivering).

Errors (``reader.errors``): ``OffsetOutOfRange``, ``NotInRemote``, ``RemoteObjectMissing``,
``RemoteDataCorrupt``, ``RemoteUnavailable``, all ``RemoteReadError``. Imports: ``metadata`` and
``tiering_core`` only (never ``tiering``).
"""

from reader.catalog import MetadataCatalog
from reader.config import ReaderSettings, load_reader_settings
from reader.consumer import TieredConsumer
from reader.cursor import CursorCache
from reader.errors import (
    NotInRemote,
    OffsetOutOfRange,
    RemoteDataCorrupt,
    RemoteObjectMissing,
    RemoteReadError,
    RemoteUnavailable,
    UnknownTopic,
)
from reader.hotdata import HotDataPreloader
from reader.messages import TieredEvent, TieredMessage
from reader.remote import RemoteReader
from reader.segments import SegmentCopy
from reader.stream import PartitionStream
from reader.txn import AbortFilter, TxnView

__all__ = [
    "AbortFilter",
    "CursorCache",
    "HotDataPreloader",
    "MetadataCatalog",
    "NotInRemote",
    "OffsetOutOfRange",
    "PartitionStream",
    "ReaderSettings",
    "RemoteDataCorrupt",
    "RemoteObjectMissing",
    "RemoteReadError",
    "RemoteReader",
    "RemoteUnavailable",
    "SegmentCopy",
    "TieredConsumer",
    "TieredEvent",
    "TieredMessage",
    "TxnView",
    "UnknownTopic",
    "load_reader_settings",
]
