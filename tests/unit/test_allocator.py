"""The allocator's thresholds (tiering_core/allocator.py): buffers of about 1 MiB freed and allocated again, as
the proxy's answers are, come back without the kernel mapping their pages anew. Each case runs in a process of
its own: the thresholds are the process's."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

_CHILD = """
import json, resource, sys
from tiering_core.allocator import keep_freed_memory
kept = keep_freed_memory(int(sys.argv[1]))
sizes = [(1 << 20) + 37 * (i % 13) for i in range(600)]  # answers of slightly different sizes
alive, before = [], resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for i, size in enumerate(sizes):
    alive.append(bytearray(size))
    if len(alive) > (2 if i % 3 else 1):  # two or three alive at once, as a connection holds them
        alive.clear()
faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
print(json.dumps({"kept": kept, "faults_per_buffer": faults / len(sizes)}))
"""


def _run(trim_bytes: int) -> dict:
    out = subprocess.run([sys.executable, "-c", _CHILD, str(trim_bytes)], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def defaults() -> dict:
    return _run(0)


def test_glibcs_moving_thresholds_map_every_answer_anew(defaults: dict) -> None:
    """What the thresholds are for: with glibc's defaults most of each 1 MiB buffer's 256 pages fault in."""
    assert defaults["kept"] is False
    assert defaults["faults_per_buffer"] > 64, defaults


def test_fixed_thresholds_reuse_freed_buffers(defaults: dict) -> None:
    tuned = _run(32 << 20)
    assert tuned["kept"] is True
    assert tuned["faults_per_buffer"] < 8, tuned
    assert tuned["faults_per_buffer"] * 10 < defaults["faults_per_buffer"], (tuned, defaults)


def test_a_trim_threshold_above_glibcs_int_is_capped_not_wrapped(defaults: dict) -> None:
    """8 GiB does not fit mallopt's int: wrapped, it would be a trim threshold of 0 (the heap's top given back at
    every free, every buffer faulted in anew); capped at 2 GiB - 1, freed buffers are reused."""
    huge = _run(8 << 30)
    assert huge["kept"] is True
    assert huge["faults_per_buffer"] < 8, (huge, defaults)
