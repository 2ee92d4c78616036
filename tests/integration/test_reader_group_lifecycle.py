"""A TieredConsumer group's life cycle on a 6-partition tiered topic (remote end at about two thirds of each
partition, the broker's log start below it): members leave and join while the partitions are read from
remote, in the part both remote and the broker hold, at the hand-over and from the broker; eager and
cooperative assignment; a member whose session times out; static members restarting. Every produced offset
comes back (exactly once where commits make it so), byte for byte, and no partition stays silent while it
has data (``Group.wait_holds``)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from deploy.stack import Endpoints
from tests.group_harness import Group, zone_holds
from tests.reader_harness import TieredTopic, tiered_topic

pytestmark = [pytest.mark.integration, pytest.mark.slow]
PARTITIONS = 6
ZONES = ("remote", "overlap", "boundary", "broker")


@pytest.fixture(scope="module")
def tiered(stack: Endpoints, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TieredTopic]:
    with tiered_topic(stack, tmp_path_factory.mktemp("reader-group-lifecycle"), records=5_000, partitions=PARTITIONS,
                      local_retention=48_000, segment_bytes=32 * 1024) as t:  # fmt: skip
        for p in range(PARTITIONS):
            remote_end = t.remote_end(p)
            assert remote_end is not None and 0 < t.log_start(p) <= remote_end < t.end_offset(p) - 1, (
                f"partition {p}: no remote part, no part both remote and local, or no broker part"
            )
        yield t


@pytest.fixture
def group(tiered: TieredTopic, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Group]:
    group = Group(tiered, PARTITIONS, tmp_path, {"group.id": f"g-{uuid.uuid4().hex[:8]}", **request.param})
    try:
        yield group
    finally:
        group.kill_all()


STRATEGIES = [{"partition.assignment.strategy": "range"}, {"partition.assignment.strategy": "cooperative-sticky"}]


@pytest.mark.parametrize(
    ("group", "zones"),
    [(STRATEGIES[0], ZONES), (STRATEGIES[1], ZONES),
     ({"group.protocol": "consumer"}, ("overlap", "boundary"))],  # KIP-848: the broker's 5 s heartbeats, fewer rounds
    ids=["eager", "cooperative", "kip848"],
    indirect=["group"],
)  # fmt: skip
def test_members_leave_and_join_in_every_zone(group: Group, tiered: TieredTopic, zones: tuple[str, ...]) -> None:
    group.hold(zone_holds(tiered, PARTITIONS, "remote"))
    for i in range(3):
        group.join(f"m{i}")
    group.wait_settled()
    group.wait_holds()
    for n, zone in enumerate(zones):
        group.hold(zone_holds(tiered, PARTITIONS, zone))
        group.wait_holds()
        group.live()[0].leave()  # the oldest: its partitions are at their holds in this zone
        group.wait_settled()
        group.wait_holds()
        group.join(f"m{3 + n}")
        group.wait_settled()
        group.wait_holds()
    group.hold(zone_holds(tiered, PARTITIONS, "end"))
    group.wait_holds()
    group.close()
    group.check(exactly_once=True)


@pytest.mark.parametrize("group", STRATEGIES, ids=["eager", "cooperative"], indirect=True)
def test_member_whose_session_times_out_loses_its_partitions(group: Group, tiered: TieredTopic) -> None:
    group.hold(zone_holds(tiered, PARTITIONS, "overlap"))
    frozen = group.join("frozen")
    for i in range(2):
        group.join(f"m{i}")
    before = group.wait_settled()
    group.wait_holds()
    frozen.freeze()  # its session times out: the others take its partitions
    group.hold(zone_holds(tiered, PARTITIONS, "boundary"))
    after = group.wait_settled()
    assert set(after.values()) == {"m0", "m1"} and "frozen" in before.values()
    group.wait_holds()
    frozen.thaw()  # finds its partitions lost, joins again
    group.wait_settled()
    assert frozen.lost, "the frozen member's partitions were not reported lost"
    group.hold(zone_holds(tiered, PARTITIONS, "broker"))
    group.wait_holds()
    group.hold(zone_holds(tiered, PARTITIONS, "end"))
    group.wait_holds()
    group.close()
    group.check(exactly_once=False)


@pytest.mark.parametrize("group", [{"session.timeout.ms": 30_000}], ids=["static"], indirect=True)
def test_static_members_restart_with_their_partitions(group: Group, tiered: TieredTopic) -> None:
    """A static member (group.instance.id) that closes keeps its partitions (no rebalance) until it is back."""
    group.hold(zone_holds(tiered, PARTITIONS, "remote"))
    for i in range(3):
        group.join(f"s{i}", **{"group.instance.id": f"s{i}"})
    owners = group.wait_settled()
    group.wait_holds()
    for n, zone in enumerate(ZONES):
        group.hold(zone_holds(tiered, PARTITIONS, zone))
        group.wait_holds()
        name = f"s{n % 3}"
        member = next(m for m in group.live() if m.name == name)
        member.leave()
        group.join(name, **{"group.instance.id": name})
        assert group.wait_settled() == owners, "a static member's restart moved partitions"
        group.wait_holds()
    group.hold(zone_holds(tiered, PARTITIONS, "end"))
    group.wait_holds()
    group.close()
    group.check(exactly_once=True)
