"""The offsets of one partition and the invariants tiering must keep between them.

Names follow the design (Tencent CKafka's notation):

- ``lx``: local log start offset (Kafka's log start offset, ListOffsets EARLIEST).
- ``ly``: last stable offset (ListOffsets LATEST with read_committed): every offset below it is
  decided (committed, aborted or non-transactional).
- ``lz``: local log end offset (ListOffsets LATEST, read_uncommitted): the next offset to be written.
- ``rx``: remote start offset, ``ry``: remote end offset (inclusive), over finished copies;
  both ``None`` while nothing is remote.

All offsets are absolute; ``lx``, ``ly`` and ``lz`` are exclusive ends or starts as Kafka defines
them, ``rx`` and ``ry`` are inclusive.
"""

from __future__ import annotations

from dataclasses import dataclass

from tiering_core.errors import TieringError


class OffsetViolation(TieringError):
    """The partition's offsets break an invariant: the sidecar must not copy or delete anything.

    The sidecar reports it (log and error metric) and retries later; usually a transient view (a
    leader change between two ListOffsets calls), otherwise a bug or outside interference to
    investigate.
    """


@dataclass(frozen=True, slots=True)
class PartitionOffsets:
    lx: int
    ly: int
    lz: int
    rx: int | None = None
    ry: int | None = None

    @property
    def remote_empty(self) -> bool:
        return self.ry is None

    @property
    def has_hole(self) -> bool:
        """True when local data starts after the remote end + 1.

        That is legitimate only when the broker's own (total) retention deleted a segment before it
        was uploaded; the remote data below the hole is then older than the total retention too.
        """
        return self.ry is not None and self.lx > self.ry + 1

    def violations(self) -> list[str]:
        """Every invariant that does not hold, as readable sentences (empty when all hold).

        ``Lz >= Ly >= Lx`` and, when remote is non-empty, ``Ly > Ry >= Rx`` (Ry is inclusive and
        below the last stable offset). A hole (``Lx > Ry + 1``) is not listed: see ``has_hole``.
        """
        problems: list[str] = []
        if not self.lz >= self.ly:
            problems.append(f"log end offset Lz={self.lz} < last stable offset Ly={self.ly}")
        if not self.ly >= self.lx:
            problems.append(f"last stable offset Ly={self.ly} < log start offset Lx={self.lx}")
        if (self.rx is None) != (self.ry is None):
            problems.append(f"remote start Rx={self.rx} and end Ry={self.ry} must both be set or unset")
        elif self.rx is not None and self.ry is not None:
            if not self.ry >= self.rx:
                problems.append(f"remote end Ry={self.ry} < remote start Rx={self.rx}")
            if not self.ly > self.ry:
                problems.append(f"remote end Ry={self.ry} is not below last stable offset Ly={self.ly}")
        return problems

    def check(self, where: str) -> None:
        """Raise OffsetViolation naming ``where`` (topic-partition) when an invariant fails."""
        problems = self.violations()
        if problems:
            raise OffsetViolation(f"{where}: " + "; ".join(problems))
