"""What the read core asks of a catalog of remote copies, and which catalogs answer it.

Two catalogs implement ``CopyCatalog``: ``MetadataCatalog`` (reader/catalog.py), which follows the sidecars'
metadata WAL (the TieredConsumer, the HTTP service, the access layer), and ``ListingCatalog``
(reader/listing.py), built from the object listing's manifests where no broker or WAL is at hand (the Spark
source, on the driver and on each executor). ``RemoteReader`` takes either: locating the copy for an offset,
walking to the next copy and confirming a copy still exists are the same code for every reader.

Both choose among overlapping copies by one rule (``tiering_core.copy_choice``: leader epoch, then base offset,
then the later copy), and a reader walking a partition from its start reads the same copies over either
(``tests/unit/test_copy_choice.py``). ``ListingCatalog`` answers an offset inside an overlap with the copy
that walk chose for it; ``MetadataCatalog`` with the preferred copy holding it, which can differ there.
"""

from __future__ import annotations

from typing import Protocol

from tiering_core.objects import SegmentRef


class CopyEntry(Protocol):
    """A finished copy as a catalog lists it (offsets inclusive)."""

    @property
    def base_offset(self) -> int: ...

    @property
    def end_offset(self) -> int: ...


class CopyCatalog(Protocol):
    """Which finished remote copies exist. ``topic_id``: of the incarnation of the topic meant (else the one
    the catalog has for the name)."""

    def copies(self, topic: str, partition: int, topic_id: str | None = None) -> list[CopyEntry]:
        """The partition's finished copies in base-offset order (overlaps included)."""
        ...

    def copy_for_offset(self, topic: str, partition: int, offset: int, topic_id: str | None = None) -> CopyEntry | None:
        """The finished copy holding ``offset`` (by the one copy-choice rule among overlapping copies), or None."""
        ...

    def remote_offsets(self, topic: str, partition: int, topic_id: str | None = None) -> tuple[int | None, int | None]:
        """(Rx, Ry): the remote start (never below a user's log start) and end, inclusive; (None, None) while
        nothing is remote."""
        ...

    def ref(self, topic: str, partition: int, copy: CopyEntry, topic_id: str | None = None) -> SegmentRef:
        """The object keys' identity of a copy this catalog listed."""
        ...

    def catch_up(self, timeout: float = 30.0) -> None:
        """Take in what changed since (before a reader concludes an offset is not remote)."""
        ...

    def download_paused(self, topic: str, topic_id: str | None = None) -> bool:
        """``tiering topic pause-download`` is in force for the topic."""
        ...

    def close(self) -> None: ...
