"""The segment watcher reports the partition directory of a newly created segment."""

from __future__ import annotations

from pathlib import Path

from tiering.watch import SegmentWatcher


def _first_seen(watcher: SegmentWatcher) -> set[str]:
    """The first non-empty report of the watcher, waiting up to 50 s in all (a very slow machine)."""
    seen: set[str] = set()
    for _ in range(50):
        seen |= watcher.wait(1.0)
        if seen:
            break
    return seen


def test_new_log_file_wakes_the_watcher(tmp_path: Path) -> None:
    part = tmp_path / "orders-3"
    part.mkdir()
    watcher = SegmentWatcher([tmp_path])
    watcher.start()
    try:
        (part / "00000000000000000042.index").write_bytes(b"")
        (part / "00000000000000000042.log").write_bytes(b"")
        seen = _first_seen(watcher)
        assert seen == {"orders-3"}
        assert watcher.wait(0.01) == set()
    finally:
        watcher.stop()


def test_a_new_partition_directory_and_a_renamed_log_are_seen_but_appends_are_not(tmp_path: Path) -> None:
    """The watch asks inotify for creations and renames only (appends to the active segment are the bulk of a
    busy broker's file events); directories created later are watched too."""
    active = tmp_path / "orders-0" / "00000000000000000000.log"
    active.parent.mkdir()
    active.write_bytes(b"")
    watcher = SegmentWatcher([tmp_path])
    watcher.start()
    try:
        for _ in range(20):
            with active.open("ab") as f:
                f.write(b"x" * 100)
        assert watcher.wait(0.5) == set()
        created = tmp_path / "orders-1"
        created.mkdir()
        (created / "00000000000000000000.log.swap").write_bytes(b"")
        (created / "00000000000000000000.log.swap").rename(created / "00000000000000000000.log")
        seen = _first_seen(watcher)
        assert seen == {"orders-1"}
    finally:
        watcher.stop()
