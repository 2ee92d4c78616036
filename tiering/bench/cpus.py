"""CPU sets for a benchmark that keeps its clients and its servers apart on one machine.

A consumer through the proxy and the same consumer straight from the broker share the machine's cores with
the broker, the proxy and the S3 server. On two cores the consumer alone uses most of them, so whatever the
proxy spends comes out of the consumer's time, which in a deployment runs on another machine. Pinning the
clients to some CPUs and every server to the others gives the deployment's shape on one machine.
"""

from __future__ import annotations

import os
import re

import click
import psutil


def parse_cpus(text: str) -> set[int]:
    """``0``, ``0,2`` or ``0-1`` as a set of CPU numbers; ClickException naming what is wrong, or a CPU this
    process may not run on."""
    cpus: set[int] = set()
    for part in text.split(","):
        found = re.fullmatch(r"\s*(\d+)(?:-(\d+))?\s*", part)
        if found is None:
            raise click.ClickException(f"--client-cpus {text!r}: expected CPU numbers such as 0, 0,2 or 0-1")
        cpus.update(range(int(found[1]), int(found[2] or found[1]) + 1))
    allowed = os.sched_getaffinity(0)
    if not cpus or not cpus < allowed:
        raise click.ClickException(f"--client-cpus {text!r}: needs some of this process's CPUs {sorted(allowed)} "
                                   "and at least one left for the servers")  # fmt: skip
    return cpus


def pin(pid: int, cpus: set[int]) -> None:
    """Every thread of process ``pid`` onto ``cpus`` (threads it starts later inherit it): a process's
    affinity set by its pid alone moves only its first thread, and a JVM runs dozens. A process gone is left."""
    try:
        threads = psutil.Process(pid).threads()
    except psutil.NoSuchProcess:
        return
    for thread in threads:
        try:
            os.sched_setaffinity(thread.id, cpus)
        except ProcessLookupError:  # the thread ended meanwhile
            continue


def pinned_command(code: str, cpus: set[int] | None) -> str:
    """Python ``code`` for ``python -c`` that first moves itself onto ``cpus`` (before any client thread starts)."""
    if cpus is None:
        return code
    return f"import os; os.sched_setaffinity(0, {sorted(cpus)!r}); {code}"
