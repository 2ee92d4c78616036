"""CPU sets of ``tiering bench proxy --client-cpus``: parsed as taskset writes them, refused when they leave no
CPU for the servers, and a process pinned on every one of its threads (a JVM's dozens, not its first alone)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import click
import psutil
import pytest

from tiering.bench.cpus import parse_cpus, pin, pinned_command

ALL = os.sched_getaffinity(0)


def _two_cpus() -> list[int]:
    """The first two CPUs this process may use: a split needs one for the clients and one for the servers (the
    project's machines have two; fewer is a failure here, not a skip)."""
    assert len(ALL) >= 2, f"splitting clients from servers needs two CPUs, this process has {sorted(ALL)}"
    return sorted(ALL)[:2]


def test_cpu_lists_parse_as_taskset_writes_them() -> None:
    first, second = _two_cpus()
    assert parse_cpus(str(first)) == {first}
    assert parse_cpus(f" {first}-{first} ") == {first}
    assert parse_cpus(f"{first},{first}-{first}") == {first}
    for both in (f"{first},{second}", f"{first}-{second}"):  # both CPUs read: then none is left for the servers
        with pytest.raises(click.ClickException, match="at least one left for the servers"):
            parse_cpus(both)


@pytest.mark.parametrize("text", ["x", "0-", ""])
def test_a_list_that_is_not_one_names_itself(text: str) -> None:
    with pytest.raises(click.ClickException, match=f"--client-cpus '{text}'"):
        parse_cpus(text)


def test_a_list_leaving_no_cpu_for_the_servers_is_refused() -> None:
    every = f"{min(ALL)}-{max(ALL)}"
    with pytest.raises(click.ClickException, match="at least one left for the servers"):
        parse_cpus(every)
    with pytest.raises(click.ClickException, match="needs some of this process's CPUs"):
        parse_cpus(str(max(ALL) + 1))


def test_every_thread_of_a_process_is_pinned_and_the_threads_it_starts_later_inherit_it() -> None:
    start = "threading.Thread(target=time.sleep, args=(60,), daemon=True).start()"
    code = (f"import threading, time, sys\nfor _ in range(4): {start}\nsys.stdin.readline()\n{start}\n"
            "print('started', flush=True); sys.stdin.readline()")  # fmt: skip
    child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    one = {_two_cpus()[0]}  # a CPU set the threads were not on before
    try:
        process = psutil.Process(child.pid)
        while len(process.threads()) < 5:
            threading.Event().wait(0.01)
        assert all(os.sched_getaffinity(t.id) != one for t in process.threads())
        pin(child.pid, one)
        assert child.stdin is not None and child.stdout is not None
        child.stdin.write("\n")
        child.stdin.flush()
        assert child.stdout.readline().strip() == "started"
        threads = process.threads()
        assert len(threads) == 6 and all(os.sched_getaffinity(t.id) == one for t in threads)
    finally:
        child.kill()
        child.wait()
    pin(child.pid, ALL)  # gone: nothing to do, no error


def test_a_pinned_child_runs_on_its_cpus_from_its_first_line() -> None:
    one = {max(ALL)}
    code = pinned_command("import os; print(sorted(os.sched_getaffinity(0)))", one)
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() \
        == str(sorted(one))  # fmt: skip
    assert pinned_command("pass", None) == "pass"
