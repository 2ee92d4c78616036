"""The facade the sidecar and the CLI use: recover, publish durably, query.

``start()`` recovers: the newest valid snapshot of this WAL (local, else remote; corrupt ones, those
of another incarnation of the WAL topic and those that need records the WAL no longer holds are
skipped), then the WAL tail up to the end offsets seen at start; then a follower thread keeps applying
new WAL records. Records missing from the WAL (removed by retention, ``delete_records`` or truncation)
are never skipped silently: recovery without a snapshot that covers them raises WalGap, and so does
the follower when it meets a gap. A follower that stops for any reason reports it through
``on_failure`` (the sidecar stops: a state that no longer follows the WAL must not drive uploads or
deletions); publishing then fails at once. ``publish(record)``
writes the record durably and waits until this process has applied it, returning whether the state
machine accepted it (a fenced or illegal transition is rejected identically on every replica).
Snapshots are written every ``snapshot_every_records`` applied records or ``snapshot_every_seconds``.

Readers (``reader/``) use it read-only: ``read_only=True`` never creates the WAL topic, never
publishes and never writes snapshots, and ``wal_partitions`` limits recovery and following to the WAL
partitions the reader's topics hash to (``MetadataWal.partition_of``), which keeps start-up cheap;
``follow_more`` adds partitions later, ``catch_up`` waits until what the WAL holds now is applied.
"""

from __future__ import annotations

import tempfile
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import replace
from pathlib import Path

from confluent_kafka import TIMESTAMP_NOT_AVAILABLE

from metadata.partition import RemotePartitionState, RemoteSegment
from metadata.records import MetadataRecord, RecordDecodeError, UnknownVersion
from metadata.snapshot import (
    Snapshot,
    SnapshotCorrupt,
    SnapshotStore,
    load_snapshot,
    local_snapshots,
    prune,
    write_snapshot,
)
from metadata.state import ACCEPTED, ApplyResult, ClusterTiering, MetadataState
from metadata.wal import MetadataWal, WalError
from segment_fsm import SegmentState, TopicTiering
from tiering_core.crash_points import crash_point
from tiering_core.logs import get_logger

log = get_logger(__name__)
_RECENT = 65536  # rejections kept for publishers waiting on their own records


class MetadataManager:
    """The sidecar's view of tiering metadata. Call ``start()`` once, then publish and query from any
    thread; queries return copies taken under ``lock``. ``close()`` stops following (idempotent).

    Snapshots are written by the follower thread (holding ``lock`` while the state is serialized,
    about 0.25 s at a million segments) and copied to ``remote`` when given.
    """

    def __init__(
        self, wal: MetadataWal, snapshot_dir: Path, *, remote: SnapshotStore | None = None,
        remote_prefix: str = "metadata-snapshots", snapshot_every_records: int = 100_000,
        snapshot_every_seconds: float = 300.0, keep_snapshots: int = 3, read_only: bool = False,
        wal_partitions: Iterable[int] | None = None, on_failure: Callable[[BaseException], None] | None = None,
    ) -> None:  # fmt: skip
        self.wal = wal
        self.snapshot_dir = Path(snapshot_dir)
        self.remote = remote
        self.remote_prefix = remote_prefix
        self.snapshot_every_records = snapshot_every_records
        self.snapshot_every_seconds = snapshot_every_seconds
        self.keep_snapshots = keep_snapshots
        self.read_only = read_only
        self.wal_partitions: set[int] | None = None if wal_partitions is None else set(wal_partitions)
        self.on_failure = on_failure
        self.state = MetadataState()
        self.next_offsets: dict[int, int] = {}
        self._apply_lag_ms = 0.0  # see take_apply_lag
        self.lock = threading.RLock()
        self._applied = threading.Condition(self.lock)
        self._rejections: OrderedDict[tuple[int, int], ApplyResult] = OrderedDict()
        self._forgotten: dict[int, int] = {}  # per WAL partition, the newest offset evicted from _rejections
        self._since_snapshot = 0
        self._last_snapshot = time.monotonic()
        self._stop = threading.Event()
        self._follower: threading.Thread | None = None
        self._follower_error: BaseException | None = None
        self._follow_wanted = False
        self.recovered_from: str = "empty"

    # -- recovery ----------------------------------------------------------------------------
    def _snapshot_candidates(self) -> Iterator[tuple[str, Path]]:
        """(source, local path) of every snapshot, newest first: local ones, then remote ones."""
        for path in local_snapshots(self.snapshot_dir):
            yield str(path), path
        if self.remote is None:
            return
        try:
            keys = self.remote.list_keys(self.remote_prefix)
        except Exception as exc:  # recovery still works without them: a longer replay
            log.error("listing remote snapshots failed", prefix=self.remote_prefix, error=str(exc))
            return
        with tempfile.TemporaryDirectory() as tmp:
            local = Path(tmp) / "snapshot"
            for key in reversed(keys):
                try:
                    self.remote.get_file(key, local)
                except Exception as exc:
                    log.error("downloading a remote snapshot failed", key=key, error=str(exc))
                    continue
                yield f"remote:{key}", local

    def _unusable(self, snapshot: Snapshot, begin: dict[int, int], end: dict[int, int]) -> str | None:
        """Why ``snapshot`` cannot start a replay of this WAL, or None: another incarnation of the
        topic, offsets beyond the WAL's end, or a tail that begins before what the WAL still holds."""
        if None not in (snapshot.wal_topic_id, self.wal.topic_id) and snapshot.wal_topic_id != self.wal.topic_id:
            return f"taken from WAL topic id {snapshot.wal_topic_id}, the WAL's id is {self.wal.topic_id}"
        partial = self.wal_partitions is not None  # only the followed partitions' ends are known
        ahead = {p: o for p, o in snapshot.wal_offsets.items() if (p in end or not partial) and o > end.get(p, 0)}
        if ahead:
            return f"covers WAL offsets beyond the WAL's end: {ahead}"
        behind = _missing(snapshot.wal_offsets, begin)
        return f"needs WAL records that are gone (partition: (next offset, first held)): {behind}" if behind else None

    def _recover_snapshot(self, begin: dict[int, int], end: dict[int, int]) -> None:
        """Load the newest snapshot this WAL can continue; corrupt and unusable ones are skipped."""
        for source, path in self._snapshot_candidates():
            try:
                snapshot = load_snapshot(path)
            except SnapshotCorrupt as exc:
                log.error("skipping a corrupt snapshot", source=source, error=str(exc))
                continue
            reason = self._unusable(snapshot, begin, end)
            if reason is not None:
                log.error("skipping a snapshot this WAL cannot continue", source=source, reason=reason)
                continue
            self.state, self.next_offsets, self.recovered_from = snapshot.state, snapshot.wal_offsets, source
            return

    def start(self, follow: bool = True) -> None:
        """Recover (snapshot + WAL tail to the current end), then follow the WAL in the background.

        Raises WalGap when no snapshot covers records the WAL no longer holds (nothing is applied then).
        """
        self.wal.ensure_topic(create=not self.read_only)
        end = self.wal.end_offsets(self.wal_partitions)
        begin = self.wal.start_offsets(self.wal_partitions)
        self._recover_snapshot(begin, end)
        self._replay(begin, end, self.wal_partitions)
        log.info(
            "metadata recovered", source=self.recovered_from, segments=self.state.segment_count(),
            applied=self.state.counters.applied,
        )  # fmt: skip
        self._follow_wanted = follow
        if follow and self.wal_partitions != set():
            self._start_follower()

    def _replay(self, begin: dict[int, int], end: dict[int, int], partitions: Iterable[int] | None) -> None:
        """Apply the WAL from ``next_offsets`` to ``end``; WalGap if records in between are gone."""
        missing = _missing(self.next_offsets, begin)
        if missing:
            p, (expected, first) = min(missing.items())
            raise self.wal.gap(
                p, expected, f"its first record is at offset {first} ({self.recovered_from} recovery; every "
                f"partition missing records, as (next offset, first held): {missing})"
            )  # fmt: skip
        for batch in self.wal.read(self.next_offsets, until=end, partitions=partitions):
            self._apply_batch(batch)

    def _start_follower(self) -> None:
        self._stop = threading.Event()
        self._follower = threading.Thread(
            target=self._follow, args=(self._stop, self.wal_partitions), name="metadata-follower", daemon=True
        )
        self._follower.start()

    def follow_more(self, partitions: Iterable[int]) -> None:
        """Also recover and follow these WAL partitions (a no-op when all are followed already).

        The state of every WAL partition was loaded from the snapshot with the offset it covers, so
        replaying the new partitions from there is exact. The follower restarts once.
        """
        if self.wal_partitions is None or set(partitions) <= self.wal_partitions:
            return
        with self.lock:
            self.wal_partitions = self.wal_partitions | set(partitions)
        if self._follower is not None:
            self._stop.set()
            self._follower.join(timeout=10)
        self._replay(self.wal.start_offsets(self.wal_partitions), self.wal.end_offsets(self.wal_partitions),
                     self.wal_partitions)  # fmt: skip
        if self._follow_wanted:
            self._start_follower()

    def catch_up(self, timeout: float = 30.0) -> None:
        """Wait until every record the followed WAL partitions hold now is applied here.

        Readers call it before trusting that an offset has no remote copy. Raises WalError after
        ``timeout`` or when the follower has failed.
        """
        end = self.wal.end_offsets(self.wal_partitions)
        deadline = time.monotonic() + timeout
        with self._applied:
            while any(self.next_offsets.get(p, 0) < o for p, o in end.items()):
                if self._follower_error is not None:
                    raise WalError(f"metadata follower failed: {self._follower_error}")
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise WalError(f"metadata of {self.wal.topic} not caught up within {timeout:.0f}s")
                self._applied.wait(min(remaining, 0.5))

    def _follow(self, stop: threading.Event, partitions: set[int] | None) -> None:
        try:
            for batch in self.wal.read(dict(self.next_offsets), stop=stop, partitions=partitions):
                self._apply_batch(batch)
                self._note_apply_lag(batch)
                self._maybe_snapshot()
        except BaseException as exc:
            self._follower_error = exc
            log.error(
                "metadata follower died: the state no longer follows the WAL", error=f"{type(exc).__name__}: {exc}",
                applied_offsets=dict(self.next_offsets), exc_info=exc,
            )  # fmt: skip
            with self._applied:
                self._applied.notify_all()
            if self.on_failure is not None:
                self.on_failure(exc)

    @property
    def failure(self) -> BaseException | None:
        """Why the follower thread died, or None while it runs (or before ``start``)."""
        return self._follower_error

    def _apply_batch(self, batch: list) -> None:
        with self._applied:
            apply = self.state.apply_payload
            rejections = self._rejections
            for m in batch:
                try:
                    result = apply(m.value())
                    if result.accepted:
                        continue
                except UnknownVersion:
                    result = ApplyResult(False, "record from a newer format version, skipped")
                except RecordDecodeError as exc:
                    where = {"wal_partition": m.partition(), "offset": m.offset()}
                    log.error("skipping an undecodable metadata record", error=str(exc), **where)
                    result = ApplyResult(False, f"undecodable record: {exc}")
                rejections[(m.partition(), m.offset())] = result
            while len(rejections) > _RECENT:
                (part, offset), _ = rejections.popitem(last=False)
                self._forgotten[part] = offset
            for m in batch:  # per partition the last message wins: offsets only grow
                self.next_offsets[m.partition()] = m.offset() + 1
            self._since_snapshot += len(batch)
            self._applied.notify_all()

    # -- publishing --------------------------------------------------------------------------
    def publish(self, record: MetadataRecord, timeout: float = 60.0) -> ApplyResult:
        """Write ``record`` durably, wait until it is applied here, return accept/reject.

        Not idempotent by itself: publishing the same transition twice writes two records, and the
        second is accepted as a self-transition (a retry), so retrying after a WalError is safe.
        Raises WalError if the write fails (nothing was written, or the outcome is unknown: retry) or
        the record is not applied within ``timeout`` (it may still be applied later).
        """
        if self.read_only:
            raise WalError("this metadata manager is read-only (a reader): it never writes the WAL")
        part, offset = self.wal.append(record)
        crash_point("metadata.appended")
        deadline = time.monotonic() + timeout
        with self._applied:
            while self.next_offsets.get(part, 0) <= offset:
                if self._follower_error is not None:
                    raise WalError(f"metadata follower failed: {self._follower_error}")
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise WalError(f"record at {self.wal.topic}[{part}]@{offset} not applied within {timeout:.0f}s")
                self._applied.wait(remaining)
            result = self._rejections.get((part, offset))
            if result is None and offset <= self._forgotten.get(part, -1):
                raise WalError(
                    f"record at {self.wal.topic}[{part}]@{offset} was applied but its outcome is no longer "
                    "known (the follower ran far ahead): query the state"
                )
            return ACCEPTED if result is None else result

    # -- queries -----------------------------------------------------------------------------
    def wal_lag(self) -> dict[int, int]:
        """Records behind the WAL's end, per followed WAL partition: the end offsets now (one
        ListOffsets request) minus what this process applied. Raises WalError when Kafka does not answer."""
        end = self.wal.end_offsets(self.wal_partitions)
        with self.lock:
            return {p: max(0, e - self.next_offsets.get(p, 0)) for p, e in sorted(end.items())}

    def _note_apply_lag(self, batch: list) -> None:
        """Keep the largest age of a followed record when applied (replayed ones are old by design)."""
        now_ms = time.time() * 1000
        stamps = [m.timestamp() for m in batch]
        ages = [now_ms - ms for kind, ms in stamps if kind != TIMESTAMP_NOT_AVAILABLE]
        if ages:
            with self.lock:
                self._apply_lag_ms = max(self._apply_lag_ms, *ages)

    def take_apply_lag(self) -> float:
        """The largest age in seconds (now minus its Kafka timestamp) of a record when it was applied here, since
        the previous call (0.0 when none was applied): how far this state trailed the WAL's writes."""
        with self.lock:
            lag, self._apply_lag_ms = self._apply_lag_ms, 0.0
        return max(0.0, lag / 1000)

    def partition_state(self, topic_id: str, partition: int) -> RemotePartitionState | None:
        """Rx, Ry, remote size, segment counts, fence and deletion state; None for an unknown partition."""
        with self.lock:
            p = self.state.partition(topic_id, partition)
            return None if p is None else p.summary()

    def remote_bounds(self, topic_id: str, partition: int) -> tuple[int | None, int | None, int] | None:
        """(Rx, Ry, the log start a user set with delete_records) without the rest of ``partition_state`` (sizes
        and counts walk every copy); None for an unknown partition."""
        with self.lock:
            p = self.state.partition(topic_id, partition)
            return None if p is None else (*p.bounds(), p.log_starts.log_start)

    def partition_changed(self, topic_id: str, partition: int) -> int:
        """A number that changes whenever a record about the partition is applied (0 while none was): equal
        answers mean its remote state is the same, without reading it."""
        with self.lock:
            p = self.state.partition(topic_id, partition)
            return 0 if p is None else p.changed

    def segment_for_offset(self, topic_id: str, partition: int, offset: int) -> RemoteSegment | None:
        """The COPY_SEGMENT_FINISHED copy holding ``offset`` (the highest leader epoch's where copies
        overlap), or None if no finished copy holds it."""
        with self.lock:
            p = self.state.partition(topic_id, partition)
            return None if p is None else p.segment_for_offset(offset)

    def duplicate_copies(self, topic_id: str, partition: int) -> list[RemoteSegment]:
        """Finished copies holding exactly the offsets of another finished copy that reads prefer: the
        partition leader's sweeper deletes them (see ``PartitionSegments.duplicates``)."""
        with self.lock:
            p = self.state.partition(topic_id, partition)
            return [] if p is None else p.duplicates()

    def counted_sizes(self, topic_id: str, partition: int) -> dict[bytes, int]:
        """Per finished copy (by segment id), the bytes it adds to the remote log's size, no offset
        counted twice (see ``PartitionSegments.counted_sizes``)."""
        with self.lock:
            p = self.state.partition(topic_id, partition)
            if p is None:
                return {}
            return {bytes(p.ids[r * 16 : r * 16 + 16]): n for r, n in p.counted_sizes().items()}

    def segments(
        self, topic_id: str, partition: int, states: Iterable[SegmentState] | None = None
    ) -> list[RemoteSegment]:
        """The partition's segment copies in base-offset order, optionally only those in ``states``."""
        wanted = None if states is None else frozenset(int(s) for s in states)
        with self.lock:
            p = self.state.partition(topic_id, partition)
            return [] if p is None else p.segments(wanted)

    def topic_state(self, topic: str) -> tuple[str, TopicTiering] | None:
        """(topic id, tiering state) of the newest topic with this name (see ``MetadataState.topic``)."""
        with self.lock:
            return self.state.topic(topic)

    def tiering(self, topic_id: str) -> TopicTiering | None:
        """The tiering state of exactly this topic id: what to use when Kafka gave the live topic's id."""
        with self.lock:
            return self.state.tiering(topic_id)

    def cluster_state(self) -> ClusterTiering:
        """Cluster-wide switches (upload pause, rollback), as a copy."""
        with self.lock:
            return replace(self.state.cluster)

    # -- snapshots ---------------------------------------------------------------------------
    def _maybe_snapshot(self) -> None:
        if self.read_only:
            return
        due = self._since_snapshot >= self.snapshot_every_records or (
            self._since_snapshot > 0 and time.monotonic() - self._last_snapshot >= self.snapshot_every_seconds
        )
        if due:
            self.snapshot_now()

    def snapshot_now(self) -> Path:
        """Write a snapshot of the state and the WAL offsets it covers, locally and remotely."""
        with self.lock:
            path = write_snapshot(self.snapshot_dir, self.state, dict(self.next_offsets), self.wal.topic_id)
            self._since_snapshot = 0
            self._last_snapshot = time.monotonic()
        crash_point("snapshot.local")
        if self.remote is not None:
            try:
                self.remote.put_file(f"{self.remote_prefix}/{path.name}", path)
                crash_point("snapshot.remote")
                keys = self.remote.list_keys(self.remote_prefix)
                for old in keys[: max(0, len(keys) - self.keep_snapshots)]:
                    self.remote.delete(old)
            except Exception as exc:  # the local copy is written; the remote one is retried next time
                log.error("copying a snapshot to the remote store failed", path=str(path), error=str(exc))
        prune(self.snapshot_dir, self.keep_snapshots)
        return path

    def close(self) -> None:
        self._stop.set()
        if self._follower is not None:
            self._follower.join(timeout=10)
        self.wal.close()


def _missing(offsets: dict[int, int], begin: dict[int, int]) -> dict[int, tuple[int, int]]:
    """Partitions whose next offset to apply is below the first record the WAL still holds, as
    partition: (next offset, first offset held)."""
    return {p: (offsets.get(p, 0), first) for p, first in sorted(begin.items()) if first > offsets.get(p, 0)}
