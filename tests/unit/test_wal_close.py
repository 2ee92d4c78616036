"""A MetadataWal stops its librdkafka clients when closed, and one nobody closed is closed at interpreter
exit: clients left polling into a half torn-down interpreter crashed pytest with SIGSEGV after every
test had passed. The cluster here is unreachable on purpose (nothing is ever delivered)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time

import pytest

from metadata.wal import MetadataWal, WalError

UNREACHABLE = "127.0.0.1:1"


def _client_threads() -> set[str]:
    return {t.name for t in threading.enumerate() if t.name in ("wal-producer-poll", "wal-reader")}


def _open_wal() -> MetadataWal:
    """A WAL with a queued write (its producer and poll thread) and a follower reading it."""
    wal = MetadataWal(UNREACHABLE, "wal", 2, timeout=1.0)
    wal.produce_async(0, b"never delivered")
    stop = threading.Event()
    started = threading.Event()

    def follow() -> None:
        started.set()
        for _ in wal.read({}, stop=stop):
            continue  # nothing arrives: the reader only has to be inside its poll loop

    threading.Thread(target=follow, name="wal-reader", daemon=True).start()
    started.wait(5)
    time.sleep(0.5)  # the reader is inside its poll loop
    return wal


def test_close_stops_the_producer_and_every_reader_despite_an_undeliverable_write() -> None:
    wal = _open_wal()
    assert _client_threads() == {"wal-producer-poll", "wal-reader"}
    wal.close(flush_seconds=0.5)
    assert _client_threads() == set()
    assert wal._producer is None
    wal.flush()  # nothing pending any more: a closed WAL has no producer to wait for


def test_a_wal_left_open_is_closed_at_interpreter_exit() -> None:
    script = textwrap.dedent(
        """
        import atexit, threading
        from tests.unit.test_wal_close import _client_threads, _open_wal
        wal = _open_wal()
        print(sorted(_client_threads()))
        atexit._run_exitfuncs()
        print(sorted(_client_threads()), wal._producer is None, flush=True)
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["['wal-producer-poll', 'wal-reader']", "[] True"]


def test_close_drops_the_admin_client_and_a_closed_wal_makes_no_new_client() -> None:
    wal = MetadataWal(UNREACHABLE, "wal", 2, timeout=1.0)
    wal._admin()
    wal.close(flush_seconds=0.1)
    assert wal._admin_client is None  # AdminClient has no close(): the last reference going destroys it
    with pytest.raises(WalError, match="closed"):
        wal.end_offsets()
    with pytest.raises(WalError, match="closed"):
        wal.append_payload(0, b"after close")
    assert wal._admin_client is None and wal._producer is None
