"""The segment watcher reports the partition directory of a newly created segment."""

from __future__ import annotations

from pathlib import Path

from tiering.watch import SegmentWatcher


def test_new_log_file_wakes_the_watcher(tmp_path: Path) -> None:
    part = tmp_path / "orders-3"
    part.mkdir()
    watcher = SegmentWatcher([tmp_path])
    watcher.start()
    try:
        (part / "00000000000000000042.index").write_bytes(b"")
        (part / "00000000000000000042.log").write_bytes(b"")
        seen: set[str] = set()
        for _ in range(50):  # bounded: up to 50 s in all on a very slow machine
            seen |= watcher.wait(1.0)
            if seen:
                break
        assert seen == {"orders-3"}
        assert watcher.wait(0.01) == set()
    finally:
        watcher.stop()
