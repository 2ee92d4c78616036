"""The C allocator's two thresholds, for a server process that receives large buffers all day.

glibc's malloc serves an allocation above ``M_MMAP_THRESHOLD`` with a mapping of its own, unmapped when it is
freed, and gives the top of its heap back to the kernel once more than ``M_TRIM_THRESHOLD`` of it is free. Both
move on their own (a freed mapping raises the mmap threshold to its size and the trim threshold to twice
that), which suits a process whose large buffers come one at a time. The proxy receives every Fetch answer of
about 1 MiB into a new buffer (``reader/proxy/frames.py``), of slightly different sizes, two or three alive at
once: their frees keep crossing the trim threshold, so the heap's top went back to the kernel and came back
page by page, every page of every answer mapped and zeroed by the kernel again (measured: 79-131 minor page faults
per MB passed through, 5.6-5.7 with the thresholds fixed; docs/design.md, "The allocator's thresholds").

Fixed thresholds stop that: freed buffers up to ``trim_bytes`` stay in the heap for the next answer. What the
process holds is still bounded by its budgets (what is kept is memory it held live before, and is reused first).
Other C libraries (musl) have no such knobs: there this does nothing.
"""

from __future__ import annotations

import ctypes

from tiering_core.logs import get_logger

log = get_logger(__name__)
M_TRIM_THRESHOLD = -1  # glibc's malloc.h
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_MAX = 32 << 20  # the largest mmap threshold glibc takes on a 64-bit machine (HEAP_MAX_SIZE / 2)
_INT_MAX = (1 << 31) - 1


def keep_freed_memory(trim_bytes: int) -> bool:
    """Keep up to ``trim_bytes`` (at most 2 GiB - 1, glibc's int) of freed memory in the heap, and serve
    allocations up to min(``trim_bytes``, 32 MiB) from it rather than from mappings of their own. False where the
    C library is not glibc (nothing changed) or ``trim_bytes`` is 0 (glibc's own moving thresholds kept)."""
    if trim_bytes <= 0:
        return False
    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
        libc.gnu_get_libc_version  # noqa: B018 (glibc only: musl has a mallopt that does nothing)
    except (OSError, AttributeError):
        log.info("the C library is not glibc: its allocator's thresholds are left as they are")
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    mmap_bytes = min(trim_bytes, MMAP_THRESHOLD_MAX)
    trim_bytes = min(trim_bytes, _INT_MAX)  # mallopt takes an int: ctypes would wrap a larger value (8 GiB to 0)
    if not (mallopt(M_MMAP_THRESHOLD, mmap_bytes) and mallopt(M_TRIM_THRESHOLD, trim_bytes)):
        log.warning("glibc refused the allocator's thresholds", mmap_threshold=mmap_bytes, trim_threshold=trim_bytes)
        return False
    log.info("allocator thresholds set", mmap_threshold=mmap_bytes, trim_threshold=trim_bytes)
    return True
