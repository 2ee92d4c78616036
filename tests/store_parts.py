"""The parts ``RemoteStore.put_parts`` takes for a body, as the copier gives them (with each part's CRC-32C)."""

from __future__ import annotations

import crc32c

from tiering_core.stores.base import Part


def parts_of(body: bytes, part_size: int) -> list[Part]:
    """The parts ``put_parts`` takes for ``body``, with the CRC-32C of each part's bytes."""
    return [
        Part(offset, len(chunk), crc32c.crc32c(chunk))
        for offset in range(0, len(body), part_size)
        for chunk in [body[offset : offset + part_size]]
    ]
