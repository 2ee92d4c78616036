"""Start, watch and stop the stack's server processes.

Each server runs in its own process group (so a stop also ends its children), with stdout and
stderr appended to a log file, and its pid recorded in the endpoints file.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import psutil

from deploy.errors import StackError, log_tail


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def spawn(argv: Sequence[str], log_file: Path, *, env: dict[str, str] | None = None, cwd: Path | None = None) -> int:
    """Start ``argv`` in a new session, output appended to ``log_file``; returns the pid."""
    log_file.parent.mkdir(parents=True, exist_ok=True)
    with log_file.open("ab") as out:
        try:
            proc = subprocess.Popen(
                list(argv),
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, **(env or {})},
                cwd=cwd,
                start_new_session=True,
            )
        except FileNotFoundError as exc:
            raise StackError(f"cannot start {argv[0]}: not found") from exc
    return proc.pid


def alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        proc = psutil.Process(pid)
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def wait_ready(component: str, pid: int, probe: Callable[[], bool], log_file: Path, timeout: float = 90.0) -> None:
    """Poll ``probe`` until it returns True; raise StackError with the log tail on death or timeout."""
    wait_until(component, probe, lambda: alive(pid), lambda: log_tail(log_file), str(log_file), timeout)


def wait_until(
    component: str,
    probe: Callable[[], bool],
    running: Callable[[], bool],
    logs: Callable[[], str],
    log_name: str,
    timeout: float = 90.0,
) -> None:
    """Poll ``probe`` (0.25 s apart) while ``running()`` holds; StackError with ``logs()`` when the
    component exits or ``timeout`` passes. A probe that raises counts as not ready yet."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not running():
            raise StackError(f"{component} exited during start-up; last lines of {log_name}:\n{logs()}")
        with contextlib.suppress(Exception):
            if probe():
                return
        time.sleep(0.25)
    raise StackError(f"{component} did not become ready within {timeout:.0f}s; last lines of {log_name}:\n{logs()}")


def stop_groups(pids: Iterable[int | None], *, timeout: float = 20.0, kill: bool = False) -> None:
    """Stop the process groups of ``pids`` together: SIGTERM (SIGKILL if ``kill``) to all, then
    SIGKILL to those still alive after ``timeout`` (one deadline for all).

    Idempotent: pids that are gone already (or None) are fine.
    """
    live = [pid for pid in pids if pid and alive(pid)]
    _signal_groups(live, signal.SIGKILL if kill else signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while (live := [pid for pid in live if _still_running(pid)]) and time.monotonic() < deadline:
        time.sleep(0.1)
    _signal_groups(live, signal.SIGKILL)
    while live := [pid for pid in live if _still_running(pid)]:
        time.sleep(0.05)


def _signal_groups(pids: list[int], sig: signal.Signals) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, sig)


def _still_running(pid: int) -> bool:
    _reap(pid)
    return alive(pid)


def _reap(pid: int) -> None:
    """Collect our own exited child so it does not linger as a zombie."""
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)
