"""Deleted topics: their partitions go through DELETE_PARTITION_MARKED / STARTED / FINISHED and every
object of theirs is deleted. One sidecar does it (the one on the lowest live broker id), since a
deleted partition has no leader.

A topic counts as deleted only on repeated evidence (``tiering.policy.deleted_topics``): Kafka must
answer, asked by name, that the topic id does not exist, for ``deleted_topic_grace_seconds`` of
observed time and in several answers in a row. The record of those answers is kept in
``<state_dir>/deleted_topics.json``, so a restart neither resets the grace nor shortcuts it.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from functools import partial

from metadata.records import topic_id_str
from segment_fsm import PartitionDeleteState
from tiering.policy.deleted_topics import Absence, counted_gap_ms, observe
from tiering.sidecar.context import SidecarContext
from tiering.sidecar.retry import Scope
from tiering.sidecar.writer import PartitionWriter
from tiering_core.logs import get_logger

log = get_logger(__name__)
ABSENCES_FILE = "deleted_topics.json"
STARTED = PartitionDeleteState.DELETE_PARTITION_STARTED
FINISHED = PartitionDeleteState.DELETE_PARTITION_FINISHED


class DeletedTopicsJanitor:
    """Deletes the remote data of topics that Kafka has said, again and again, no longer exist."""

    def __init__(self, ctx: SidecarContext) -> None:
        self.ctx = ctx
        self.path = ctx.settings.state_dir / ABSENCES_FILE
        self.absences = self._load()

    def _load(self) -> dict[str, Absence]:
        try:
            raw = json.loads(self.path.read_text())
            return {topic_id: Absence(**fields) for topic_id, fields in raw.items()}
        except FileNotFoundError:
            return {}
        except (ValueError, TypeError, AttributeError) as exc:  # the grace starts again: the safe side
            log.error("ignoring an unreadable deleted-topics file", path=str(self.path), error=str(exc))
            return {}

    def _save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{ABSENCES_FILE}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps({topic_id: asdict(a) for topic_id, a in sorted(self.absences.items())}))
        tmp.replace(self.path)

    def run(self) -> int:
        """Ask Kafka about every topic id with remote data, record the answer, and delete the remote
        data of those deleted long enough; returns how many partitions finished deleting."""
        ctx = self.ctx
        with ctx.manager.lock:
            partitions = [
                (topic_id_str(tid), num, p.topic, p.fence, p.delete_state)
                for (tid, num), p in ctx.manager.state.partitions.items()
                if p.delete_state != FINISHED
            ]
        candidates = {topic_id: topic for topic_id, _, topic, _, _ in partitions}
        answer = ctx.cluster.topic_ids(candidates.values())
        grace_ms = int(ctx.settings.deleted_topic_grace_seconds * 1000)
        absences = observe(self.absences, candidates, answer, ctx.now_ms(), counted_gap_ms(grace_ms))
        for topic_id in absences.keys() - self.absences.keys():
            log.warning("a tiered topic id is missing from Kafka's answer; its remote data is deleted if this "
                        "lasts", topic=candidates[topic_id], topic_id=topic_id,
                        grace_seconds=ctx.settings.deleted_topic_grace_seconds)  # fmt: skip
        for topic_id in self.absences.keys() - absences.keys():
            if topic_id in candidates and answer.get(candidates[topic_id]) == topic_id:
                log.warning("a tiered topic id missing earlier is back; nothing was deleted",
                            topic=candidates[topic_id], topic_id=topic_id)  # fmt: skip
        if absences != self.absences:
            self.absences = absences
            self._save()
        finished = 0
        for topic_id, num, topic, fence, current in partitions:
            if ctx.stopping.is_set():
                break
            if topic not in answer or answer[topic] == topic_id:
                if current == STARTED and topic in answer:
                    log.error("a live topic's partition is being deleted; not continuing", topic=topic,
                              topic_id=topic_id, partition=num)  # fmt: skip
                continue  # there, or no evidence in this answer
            absence = absences.get(topic_id)
            if current == STARTED or (absence is not None and absence.due(grace_ms)):
                writer = PartitionWriter(ctx, Scope(topic, topic_id, num), *fence)
                # each partition on its own: a failure backs off alone
                done = ctx.retry.run(writer.scope, "delete_partition", partial(_delete_partition, writer, current))
                finished += bool(done)
        return finished


def _delete_partition(writer: PartitionWriter, current: PartitionDeleteState | None) -> bool:
    """One deleted partition: MARKED, STARTED, every copy deleted, leftovers deleted, FINISHED. Raises on
    failure (the caller retries with backoff); True when DELETE_PARTITION_FINISHED was written."""
    publish = writer.ctx.manager.publish
    for state in (PartitionDeleteState.DELETE_PARTITION_MARKED, PartitionDeleteState.DELETE_PARTITION_STARTED):
        if current is None or current < state:
            publish(writer.partition_delete_record(state))
    segments = writer.undeleted_copies()
    if not all(writer.delete_copy(s) for s in segments):
        return False
    leftovers = writer.delete_leftovers()
    if not publish(writer.partition_delete_record(PartitionDeleteState.DELETE_PARTITION_FINISHED)).accepted:
        return False
    log.info("deleted the remote data of a deleted topic's partition", topic=writer.scope.topic,
             partition=writer.scope.partition, segments=len(segments), leftover_objects=leftovers)  # fmt: skip
    return True
