"""Checking and splitting the batches of a byte range of a remote ``.log`` object.

A ranged read starts at a batch boundary (from the offset index) and may end inside a batch; only
complete batches are handed on, the rest is carried into the next range. Every batch served has its
CRC-32C checked, and its offsets must lie inside the copy and grow: the CRC does not cover the
base offset, so a damaged base offset is caught by that check (and by the whole object's CRC-32C
when a read covers the whole object).
"""

from __future__ import annotations

import crc32c

from reader.errors import RemoteDataCorrupt
from tiering_core.errors import FormatError
from tiering_core.formats import BatchHeader, scan_headers
from tiering_core.formats.batch import LOG_OVERHEAD, MIN_LENGTH
from tiering_core.formats.native import NATIVE

_native = NATIVE  # the compiled module, or None (tests set it to None to run the reference)


def complete_prefix(key: str, buf: bytes | memoryview, base_position: int) -> int:
    """Length of the longest prefix of ``buf`` made of whole batches (by their length fields).

    ``base_position`` is where ``buf`` starts in the object (for error positions). Raises
    RemoteDataCorrupt for a length field that cannot be a v2 batch.
    """
    pos = 0
    end = len(buf)
    while end - pos >= LOG_OVERHEAD:
        length = int.from_bytes(buf[pos + 8 : pos + 12], "big", signed=True)
        if length < MIN_LENGTH:
            raise RemoteDataCorrupt(
                key, base_position + pos, f"batch length {length} is below the minimum {MIN_LENGTH}"
            )
        if pos + LOG_OVERHEAD + length > end:
            break
        pos += LOG_OVERHEAD + length
    return pos


def checked_headers(key: str, buf: bytes | memoryview, base_position: int, first: int, last: int,
                    after: int) -> list[BatchHeader]:  # fmt: skip
    """Headers of the whole batches in ``buf`` (all of it must be whole batches), their offsets checked
    (``scanned_headers`` then ``check_offsets``)."""
    headers = scanned_headers(key, buf, base_position)
    check_offsets(key, headers, base_position, first, last, after)
    return headers


def scanned_headers(key: str, buf: bytes | memoryview, base_position: int) -> list[BatchHeader]:
    """Headers of the whole batches in ``buf`` (all of it must be whole batches); RemoteDataCorrupt naming
    the position in the object (``buf`` starts at ``base_position``) for one that does not parse."""
    try:
        return list(scan_headers(key, buf))
    except FormatError as exc:
        raise RemoteDataCorrupt(key, base_position + exc.position, exc.reason) from exc


def check_offsets(key: str, headers: list[BatchHeader], base_position: int, first: int, last: int,
                  after: int) -> None:  # fmt: skip
    """Offsets must lie in ``[first, last]`` (the copy's) and grow from above ``after`` (the last offset
    seen before these batches, or ``first - 1``). CRCs are checked later, by the decoder, for the batches
    actually served. Positions in errors are positions in the object."""
    for h in headers:
        if h.base_offset <= after or h.last_offset > last or h.base_offset < first:
            raise RemoteDataCorrupt(
                key, base_position + h.position,
                f"batch offsets {h.base_offset}..{h.last_offset} out of order or outside the copy's {first}..{last}",
            )  # fmt: skip
        after = h.last_offset


def verify_crcs(key: str, data: bytes | memoryview, headers: list[BatchHeader], base_position: int) -> None:
    """Check every batch's CRC-32C; RemoteDataCorrupt naming the key and the batch's position in the object.
    Over a memoryview: a slice of ``bytes`` would copy every batch first (0.18 against 0.11 s of CPU per GB
    measured over 16 KiB batches)."""
    view = memoryview(data)
    for h in headers:
        pos = h.position
        actual = crc32c.crc32c(view[pos + 21 : pos + h.size])
        if actual != h.crc:
            raise RemoteDataCorrupt(key, base_position + pos, f"CRC-32C mismatch: stored {h.crc}, computed {actual}")


def checked_window(key: str, data: bytes | memoryview, base_position: int, first: int, last: int,
                   after: int) -> list[BatchHeader]:  # fmt: skip
    """The headers of a downloaded window that must be whole batches: its length fields walked
    (``complete_prefix``), every header checked, offsets inside ``[first, last]`` and growing from above ``after``
    (``check_offsets``), every batch's CRC-32C (``verify_crcs``), in that order; RemoteDataCorrupt naming the key
    and the position in the object for the first fault. The compiled module does it in one call with the GIL
    released (``native/src/window.rs``), the same checks with the same faults; this is the reference."""
    if _native is not None:
        try:
            return _native.checked_window(data, first, last, after, BatchHeader)  # type: ignore[no-any-return]
        except _native.DecodeError as exc:
            raise RemoteDataCorrupt(key, base_position + exc.args[1], exc.args[2]) from exc
    whole = complete_prefix(key, data, base_position)
    if whole != len(data):
        raise RemoteDataCorrupt(key, base_position + whole, "a window of the object ends inside a batch")
    headers = checked_headers(key, data, base_position, first, last, after)
    verify_crcs(key, data, headers, base_position)
    return headers
