"""One copy-choice rule: where copies overlap, the sidecar's readers (the metadata's ``segment_for_offset``)
and the Spark source (``choose_copies`` over the manifests) read every offset from the same copy."""

from __future__ import annotations

import uuid

from hypothesis import given
from hypothesis import strategies as st

from metadata import MetadataState
from reader.listing import choose_copies
from segment_fsm import SegmentState
from tests.metadata_factory import TOPIC_ID, seg
from tiering_core.copy_choice import holder, walk
from tiering_core.objects import Manifest

CopySpec = tuple[int, int, int, int]  # base, length, leader epoch, the records' highest epoch below it


def _manifest(sid: uuid.UUID, base: int, end: int, epoch: int, data_epoch: int, created: int) -> Manifest:
    return Manifest(topic="orders", topic_id=TOPIC_ID, partition=0, segment_id=sid, base_offset=base,
                    end_offset=end, max_timestamp=0, leader_epochs=[(data_epoch, base)], log_size=1,
                    log_crc32c=0, indexes_size=0, indexes_crc32c=0, index_parts={}, created_ms=created,
                    leader_epoch=epoch)  # fmt: skip


def _metadata_walk(specs: list[tuple[uuid.UUID, int, int, int]]) -> list[tuple[uuid.UUID, int, int]]:
    """(copy, first, last) as a TieredConsumer reads from the lowest offset: the copy for an offset to its end,
    then the next offset (over holes)."""
    state = MetadataState()
    for sid, base, end, epoch in sorted(specs, key=lambda s: s[3]):  # the WAL fences older epochs: in order
        for st_ in (SegmentState.COPY_SEGMENT_STARTED, SegmentState.COPY_SEGMENT_FINISHED):
            assert state.apply(seg(sid, st_, base, end, epoch=epoch)).accepted
    p = state.partition(TOPIC_ID, 0)
    assert p is not None
    out, offset, top = [], min(s[1] for s in specs), max(s[2] for s in specs)
    while offset <= top:
        found = p.segment_for_offset(offset)
        if found is None:
            offset = min(s[1] for s in specs if s[1] > offset)
            continue
        out.append((uuid.UUID(bytes=found.segment_id), offset, found.end_offset))
        offset = found.end_offset + 1
    return out


@given(st.lists(st.tuples(st.integers(0, 300), st.integers(1, 120), st.integers(0, 4), st.integers(0, 4)),
                min_size=1, max_size=12))  # fmt: skip
def test_metadata_and_manifests_choose_the_same_copy_for_every_offset(copies: list[CopySpec]) -> None:
    specs = [(uuid.uuid4(), base, base + length - 1, epoch) for base, length, epoch, _ in copies]
    # the manifests in the WAL's order (epoch, then as written): ``created`` follows it
    order = sorted(range(len(specs)), key=lambda i: specs[i][3])
    manifests = [_manifest(specs[i][0], specs[i][1], specs[i][2], specs[i][3], min(copies[i][3], specs[i][3]), n)
                 for n, i in enumerate(order)]  # fmt: skip
    chosen = [(c.manifest.segment_id, c.first, c.last) for c in choose_copies(manifests)]
    assert chosen == _metadata_walk(specs)


def test_the_copying_leaders_epoch_wins_over_the_records_epochs() -> None:
    """After an unclean election the new leader (epoch 5) copies records of epoch 2 over offsets the old leader
    (epoch 4) copied with records of epoch 4: the partition's log is the new leader's."""
    old, new = uuid.uuid4(), uuid.uuid4()
    manifests = [_manifest(old, 0, 99, 4, 4, 1), _manifest(new, 0, 99, 5, 2, 2)]
    assert [c.manifest.segment_id for c in choose_copies(manifests)] == [new]
    assert _metadata_walk([(old, 0, 99, 4), (new, 0, 99, 5)]) == [(new, 0, 99)]


@given(st.lists(st.tuples(st.integers(0, 60), st.integers(1, 30), st.integers(0, 3), st.booleans()), max_size=10),
       st.integers(0, 100))  # fmt: skip
def test_the_holder_is_the_highest_ranked_copy_holding_the_offset_and_the_walk_follows_holders(
    rows: list[tuple[int, int, int, bool]], offset: int
) -> None:
    """Against the definition, by brute force: rows (base, length, epoch, finished); unfinished rows hold
    nothing; rank is (epoch, base, row)."""
    base = [b for b, _, _, _ in rows]
    end = [b + n - 1 for b, n, _, _ in rows]
    order = sorted(range(len(rows)), key=base.__getitem__)
    span = max((n - 1 for _, n, _, _ in rows), default=0)

    def rank(r: int) -> tuple[int, int, int] | None:
        return (rows[r][2], base[r], r) if rows[r][3] else None

    def expected(o: int) -> int | None:
        holding = [r for r in range(len(rows)) if rows[r][3] and base[r] <= o <= end[r]]
        return max(holding, key=rank, default=None)  # type: ignore[arg-type]

    assert holder(offset, order, base, end, rank, span) == expected(offset)
    steps = list(walk(order, base, end, rank, span))
    held = sorted({o for r in range(len(rows)) if rows[r][3] for o in range(base[r], end[r] + 1)})
    walked = [o for _, first, last in steps for o in range(first, last + 1)]
    assert walked == held, "the walk skips or repeats an offset some copy holds"
    for row, first, last in steps:
        assert expected(first) == row and last == end[row], "each step enters the holder and reads it to its end"
