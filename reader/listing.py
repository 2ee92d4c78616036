"""The remote copies of a topic's partitions, found from the object listing alone (no broker, no WAL), and
``ListingCatalog``: the read core's catalog (``reader.copy_catalog.CopyCatalog``) over what was listed.

A copy counts once its manifest exists: the manifest is the last object a copy writes, and the
first one a deletion removes, so a listed manifest is a finished copy (or one whose deletion has
just begun: its ``.log`` may vanish while it is read, which fails the read naming the key). Where
copies overlap (after a leader change, or a retried copy) the choice is the metadata's too:
``tiering_core.copy_choice`` over ``Manifest.preference``.
"""

from __future__ import annotations

import bisect
import re
from collections import defaultdict
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from tiering_core.copy_choice import walk
from tiering_core.errors import TieringError
from tiering_core.objects import Manifest, SegmentRef, parse_key
from tiering_core.stores.prefixed import PrefixedStore

_TOPIC_ID_LEN = 22  # Kafka's Uuid in URL-safe base64, no padding
_MANIFEST_THREADS = 16


class UnknownTopic(TieringError):
    """No remote copy of the topic exists under the prefix: check the name, the prefix and that it is tiered."""


@dataclass(frozen=True)
class Copy:
    """A finished remote copy of one segment, with the offsets it is chosen for (inclusive)."""

    manifest: Manifest
    log_key: str
    indexes_key: str
    first: int
    last: int

    @property
    def epoch(self) -> int:
        """The leader epoch that decided for this copy (``Manifest.preference``)."""
        return self.manifest.preference()[0]


@dataclass(frozen=True)
class RemotePartition:
    """The copies that together cover a partition's remote offsets, in offset order, without overlap."""

    topic: str
    topic_id: str
    partition: int
    copies: tuple[Copy, ...]

    @property
    def start(self) -> int:
        return self.copies[0].first

    @property
    def end(self) -> int:
        """The last remote offset (Ry)."""
        return self.copies[-1].last


def split_topic_dir(name: str) -> tuple[str, str] | None:
    """(topic, topic id) of a ``<topic>-<topicId>`` directory name, None for anything else."""
    if len(name) < _TOPIC_ID_LEN + 2 or name[-_TOPIC_ID_LEN - 1] != "-":
        return None
    return name[: -_TOPIC_ID_LEN - 1], name[-_TOPIC_ID_LEN:]


def list_remote_partitions(
    store: PrefixedStore, topics: list[str] | None = None, pattern: str | None = None,
    topic_ids: dict[str, str] | None = None, *, require: bool = True,
) -> list[RemotePartition]:  # fmt: skip
    """The remote partitions of ``topics`` (or of every topic matching ``pattern``), sorted.

    A name with copies of several incarnations (deleted and recreated) resolves to the one given in
    ``topic_ids``, else to the one with the newest copy. Raises UnknownTopic for a named topic that
    has no copy (unless not ``require``d: the broker may still have it all).
    """
    keys: list[str] = []
    if topics is not None:
        for topic in topics:
            keys.extend(store.list_keys(f"{topic}-"))
    else:
        keys = store.list_keys("")
    regex = re.compile(pattern) if pattern is not None else None
    manifests: dict[tuple[str, str, int], list[str]] = defaultdict(list)
    for key in keys:
        parts = key.split("/")
        parsed = parse_key(key)
        named = split_topic_dir(parts[0]) if len(parts) == 3 else None
        if named is None or parsed is None or parsed[2] != "manifest" or not parts[1].isdigit():
            continue
        topic, topic_id = named
        if (topics is not None and topic not in topics) or (regex is not None and not regex.fullmatch(topic)):
            continue
        manifests[(topic, topic_id, int(parts[1]))].append(key)
    with ThreadPoolExecutor(_MANIFEST_THREADS) as pool:
        loaded = dict(zip(
            [k for ks in manifests.values() for k in ks],
            pool.map(lambda k: Manifest.decode(store.get_bytes(k), k), [k for ks in manifests.values() for k in ks]),
            strict=True,
        ))  # fmt: skip
    newest: dict[str, tuple[int, str]] = {}
    for (topic, topic_id, _), ks in manifests.items():
        created = max(loaded[k].created_ms for k in ks)
        if topic_ids and topic in topic_ids:
            created = 1 << 62 if topic_ids[topic] == topic_id else -1
        if created > newest.get(topic, (-2, ""))[0]:
            newest[topic] = (created, topic_id)
    for topic in topics if require and topics else []:
        if topic not in newest:
            raise UnknownTopic(f"topic {topic!r} has no remote copy under {store.location}")
    out = []
    for (topic, topic_id, partition), ks in sorted(manifests.items()):
        if newest[topic][1] != topic_id:
            continue
        copies = choose_copies([loaded[k] for k in ks])
        out.append(RemotePartition(topic, topic_id, partition, tuple(copies)))
    return out


def choose_copies(manifests: list[Manifest]) -> list[Copy]:
    """The copies a reader walking the manifests from the lowest offset reads (``copy_choice.walk``), each with
    the offsets it is read for, in order (holes stay holes)."""
    ordered = sorted(manifests, key=lambda m: m.base_offset)
    base = [m.base_offset for m in ordered]
    end = [m.end_offset for m in ordered]
    span = max((e - b for b, e in zip(base, end, strict=True)), default=0)
    chosen = []
    for row, first, last in walk(range(len(ordered)), base, end, lambda r: ordered[r].preference(), span):
        ref = ordered[row].ref
        chosen.append(Copy(ordered[row], ref.key("log"), ref.key("indexes"), first, last))
    return chosen


class ListingCatalog:
    """``CopyCatalog`` over listed partitions (``list_remote_partitions``): the copies a plan saw, each chosen for
    the offsets ``choose_copies`` gave it (a partition's ``first`` already raised to a user's log start, as the
    Spark source's plan does). It never changes: a copy deleted since reads as a missing object, naming its key."""

    def __init__(self, partitions: Iterable[RemotePartition]) -> None:
        self._partitions = {(rp.topic_id, rp.partition): rp for rp in partitions if rp.copies}
        self._ids = {rp.topic: rp.topic_id for rp in self._partitions.values()}

    def _partition(self, topic: str, partition: int, topic_id: str | None) -> RemotePartition | None:
        return self._partitions.get((topic_id or self._ids.get(topic, ""), partition))

    def copies(self, topic: str, partition: int, topic_id: str | None = None) -> list[Manifest]:
        rp = self._partition(topic, partition, topic_id)
        return [] if rp is None else [c.manifest for c in rp.copies]

    def copy_for_offset(self, topic: str, partition: int, offset: int, topic_id: str | None = None) -> Manifest | None:
        rp = self._partition(topic, partition, topic_id)
        if rp is None:
            return None
        i = bisect.bisect_right(rp.copies, offset, key=lambda c: c.first) - 1
        return rp.copies[i].manifest if i >= 0 and offset <= rp.copies[i].last else None

    def remote_offsets(self, topic: str, partition: int, topic_id: str | None = None) -> tuple[int | None, int | None]:
        rp = self._partition(topic, partition, topic_id)
        return (None, None) if rp is None else (rp.start, rp.end)

    def ref(self, topic: str, partition: int, copy: Manifest, topic_id: str | None = None) -> SegmentRef:
        return copy.ref

    def catch_up(self, timeout: float = 30.0) -> None:
        """Nothing to take in: the catalog is the listing the plan was made from."""

    def download_paused(self, topic: str, topic_id: str | None = None) -> bool:
        """The listing knows no tiering state: a paused topic's copies are still read (as ``tiering export`` does)."""
        return False

    def close(self) -> None:
        """Holds no clients."""
