"""A consumer group of TieredConsumer processes (``tests.group_member``) driven by a test: members join,
leave, freeze; holds move the partitions' positions from zone to zone; everything delivered is kept."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.group_member import unb64
from tests.reader_harness import TieredTopic, expected

STALL_SECONDS = 30  # no position moved for this long while a partition is below its hold: silent
SETTLE_SECONDS = 90  # a rebalance must be over by then


class Member:
    """A member process and what it reported."""

    def __init__(self, group: Group, name: str, config: dict[str, Any]) -> None:
        self.group, self.name = group, name
        spec = {"config": config, "settings": str(group.tiered.config), "topic": group.tiered.topic,
                "holds": str(group.holds_path), "batch": group.batch}  # fmt: skip
        self.log = group.dir / f"{name}.log"
        with self.log.open("wb") as stderr:
            self.proc = subprocess.Popen([sys.executable, "-m", "tests.group_member", json.dumps(spec)],
                                         stdout=subprocess.PIPE, stderr=stderr, cwd=Path(__file__).parent.parent,
                                         env={**os.environ, "PYTHONUNBUFFERED": "1"})  # fmt: skip
        self.positions: dict[int, int] = {}
        self.lost: list[list[int]] = []
        self.revoked: list[list[int]] = []
        self.errors: list[str] = []
        self.closed = False
        self.frozen = False
        self.reader = threading.Thread(target=self._read, name=f"member-{name}", daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            event = json.loads(line)
            with self.group.lock:
                if "records" in event:
                    for p, o, k, v, h, remote in event["records"]:
                        headers = [(hk, unb64(hv)) for hk, hv in h]
                        self.group.got[p].append((o, unb64(k), unb64(v), headers, self.name, remote))
                    self.group.moved = time.monotonic()
                elif "positions" in event:
                    self.positions = {int(p): o for p, o in event["positions"].items()}
                    self.group.moved = time.monotonic()
                elif "lost" in event:
                    self.lost.append(event["lost"])
                elif "revoked" in event:
                    self.revoked.append(event["revoked"])
                elif "error" in event:
                    self.errors.append(event["error"])
                elif "closed" in event:
                    self.closed = True

    @property
    def live(self) -> bool:
        return self.proc.poll() is None and not self.frozen

    def leave(self) -> None:
        """Close the consumer (commit, leave the group) and wait for the process to end."""
        self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.send_signal(signal.SIGUSR1)  # its threads' stacks to its log (faulthandler)
            time.sleep(2)
            self.kill()
            tail = self.log.read_text(errors="replace")[-6000:]
            raise AssertionError(
                f"member {self.name} did not end within 60 s of SIGTERM; its log ends:\n{tail}"
            ) from None
        assert code == 0, f"member {self.name} failed: see {self.log}"
        self.reader.join(10)
        assert self.closed, f"member {self.name} did not close"
        self.positions = {}

    def freeze(self) -> None:
        self.proc.send_signal(signal.SIGSTOP)
        self.frozen = True

    def thaw(self) -> None:
        self.proc.send_signal(signal.SIGCONT)
        self.frozen = False

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)


class Group:
    """Members of one consumer group reading ``tiered``; ``got[p]``: every delivery of partition p, in the
    order its member reported them: (offset, key, value, headers, member, remote?)."""

    def __init__(self, tiered: TieredTopic, partitions: int, workdir: Path, config: dict[str, Any],
                 batch: int = 100) -> None:  # fmt: skip
        self.tiered, self.partitions, self.dir, self.batch = tiered, partitions, workdir, batch
        kip848 = config.get("group.protocol") == "consumer"  # session and heartbeat are the broker's settings
        timing = {} if kip848 else {"session.timeout.ms": 6000, "heartbeat.interval.ms": 500}
        self.config = {"bootstrap.servers": tiered.ctx.settings.bootstrap_servers, "auto.offset.reset": "earliest",
                       "auto.commit.interval.ms": 1000, **timing, **config}  # fmt: skip
        self.holds_path = workdir / "holds.json"
        self.holds: dict[int, int] = {}
        self.members: list[Member] = []
        self.got: dict[int, list[tuple]] = {p: [] for p in range(partitions)}
        self.lock = threading.Lock()
        self.moved = time.monotonic()

    # -- the test's controls -----------------------------------------------------------------
    def join(self, name: str, **config: Any) -> Member:
        member = Member(self, name, {**self.config, **config})
        self.members.append(member)
        return member

    def live(self) -> list[Member]:
        return [m for m in self.members if m.live]

    def hold(self, offsets: dict[int, int]) -> None:
        """Members pause each partition once its position reaches ``offsets[p]`` (resume below it)."""
        self.holds = dict(offsets)
        tmp = self.holds_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(offsets))
        tmp.replace(self.holds_path)

    def close(self) -> None:
        for member in self.members:
            if member.frozen:
                member.thaw()
            if member.proc.poll() is None:
                member.leave()

    def kill_all(self) -> None:
        for member in self.members:
            if member.frozen:
                member.thaw()
            member.kill()

    # -- waiting for the group --------------------------------------------------------------------
    def owners(self) -> dict[int, list[str]]:
        with self.lock:
            owners: dict[int, list[str]] = {p: [] for p in range(self.partitions)}
            for m in self.live():
                for p in m.positions:
                    owners[p].append(m.name)
            return owners

    def wait_settled(self) -> dict[int, str]:
        """Until every partition has exactly one live owner and every live member owns one; the owners."""
        deadline = time.monotonic() + SETTLE_SECONDS
        while time.monotonic() < deadline:
            owners = self.owners()
            names = {m.name for m in self.live()}
            if all(len(o) == 1 for o in owners.values()) and names == {o[0] for o in owners.values()}:
                return {p: o[0] for p, o in owners.items()}
            self._check_members()
            time.sleep(0.2)
        raise AssertionError(f"the group did not settle in {SETTLE_SECONDS}s: owners {self.owners()}")

    def wait_holds(self) -> None:
        """Until every partition's owner is at its hold: a partition below its hold while no position moved
        for STALL_SECONDS is silent (it has data: the hold is at most the end offset)."""
        while True:
            with self.lock:
                behind = {p: (m.name, m.positions[p], self.holds[p]) for m in self.live() for p in m.positions
                          if m.positions[p] < self.holds[p]}  # fmt: skip
                owned = {p for m in self.live() for p in m.positions}
                quiet = time.monotonic() - self.moved
            if not behind and len(owned) == self.partitions:
                return
            self._check_members()
            assert quiet < STALL_SECONDS, (
                f"partitions silent for {quiet:.0f}s below their holds (owner, position, hold): {behind}; "
                f"unowned: {sorted(set(range(self.partitions)) - owned)}"
            )
            time.sleep(0.2)

    def _check_members(self) -> None:
        for m in self.members:
            code = m.proc.poll()
            assert code is None or m.closed, f"member {m.name} exited with {code}: see {m.log}"

    # -- what was delivered -----------------------------------------------------------------------
    def check(self, exactly_once: bool, read_committed: bool = True) -> None:
        """Every produced offset delivered (once each when ``exactly_once``), byte for byte; each member's
        deliveries of a partition in offset order; no error event."""
        errors = {m.name: m.errors for m in self.members if m.errors}
        assert not errors, f"error events: {errors}"
        for p in range(self.partitions):
            want = expected(self.tiered.by_partition[p], read_committed)
            got = self.got[p]
            offsets = [g[0] for g in got]
            missing, extra = sorted(set(want) - set(offsets)), sorted(set(offsets) - set(want))
            assert not missing and not extra, f"partition {p}: missing {missing[:10]}, extra {extra[:10]}"
            if exactly_once:
                assert len(offsets) == len(set(offsets)), f"partition {p}: {len(offsets) - len(set(offsets))} twice"
            for offset, key, value, headers, member, _ in got:
                assert (key, value, headers) == want[offset], f"partition {p} offset {offset} ({member}) differs"
            for m in self.members:
                own = [g[0] for g in got if g[4] == m.name]
                assert own == sorted(own), f"partition {p}: {m.name} delivered out of order"


def zone_holds(tiered: TieredTopic, partitions: int, zone: str) -> dict[int, int]:
    """Hold offsets in a zone of every partition: ``remote`` (below the broker's log start Lx), ``overlap``
    (remote and on the broker: [Lx, H), H the remote end + 1), ``boundary`` (H, the hand-over), ``broker``
    (past H) and ``end``."""
    where: dict[str, Callable[[int, int, int], int]] = {
        "remote": lambda lx, h, end: lx // 2,
        "overlap": lambda lx, h, end: (lx + h) // 2,
        "boundary": lambda lx, h, end: h,
        "broker": lambda lx, h, end: (h + end) // 2,
        "end": lambda lx, h, end: end,
    }
    out = {}
    for p in range(partitions):
        remote_end = tiered.remote_end(p)
        assert remote_end is not None
        out[p] = where[zone](tiered.log_start(p), remote_end + 1, tiered.end_offset(p))
    return out
