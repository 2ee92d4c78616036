"""Exactly-once Parquet output: files staged by Spark, moved into place, then a commit marker, last.

Layout under the output path::

    partition=<p>/date=<yyyy-mm-dd>/<run id>-part-....parquet   data (readers skip nothing else)
    _kafka_tiered/<topic>/<seq>-<run id>.json                    one marker per committed run
    _staging/<run id>/...                                        Spark's output while a run writes

A run's rows count only once its marker exists: the marker names the run's files and the offset
range it covered per partition, and the next incremental run starts after the highest ``last``.
A run that fails leaves no marker; its staged and moved files are deleted by the run itself and, if
it was killed, by the next run (files whose run id has no marker). Spark and pyarrow skip paths
starting with ``_``, so readers never see markers or staging. One export writes to a path at a time.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from dataclasses import dataclass

import pyarrow.parquet as pq
from pyarrow import fs as pafs

MARKERS = "_kafka_tiered"
STAGING = "_staging"


@dataclass(frozen=True)
class Marker:
    seq: int
    run_id: str
    topic: str
    topic_id: str
    ranges: dict[int, tuple[int, int]]
    files: list[str]
    rows: int


class ParquetOutput:
    """The output directory of one topic's exports (any pyarrow filesystem URI or a local path)."""

    def __init__(self, path: str, topic: str) -> None:
        self.fs, self.root = (
            pafs.FileSystem.from_uri(path) if "://" in path else (pafs.LocalFileSystem(), os.path.abspath(path))
        )
        self.root = self.root.rstrip("/")
        self.topic = topic

    def _markers_dir(self) -> str:
        return f"{self.root}/{MARKERS}/{self.topic}"

    def staging(self, run_id: str) -> str:
        return f"{self.root}/{STAGING}/{run_id}"

    def markers(self, every_topic: bool = False) -> list[Marker]:
        """Committed runs of this topic (or of every topic exported to the path), oldest first."""
        where = f"{self.root}/{MARKERS}" if every_topic else self._markers_dir()
        selector = pafs.FileSelector(where, recursive=every_topic, allow_not_found=True)
        out = []
        for info in self.fs.get_file_info(selector):
            if info.is_file and info.base_name.endswith(".json"):
                with self.fs.open_input_stream(info.path) as f:
                    raw = json.loads(f.read())
                out.append(Marker(raw["seq"], raw["run_id"], raw["topic"], raw["topic_id"],
                                  {int(p): (r[0], r[1]) for p, r in raw["ranges"].items()}, raw["files"],
                                  raw["rows"]))  # fmt: skip
        return sorted(out, key=lambda m: m.seq)

    def committed_ends(self) -> dict[int, int]:
        """The last offset exported per partition, over every committed run."""
        ends: dict[int, int] = {}
        for marker in self.markers():
            for partition, (_, last) in marker.ranges.items():
                ends[partition] = max(ends.get(partition, -1), last)
        return ends

    def remove_uncommitted(self) -> list[str]:
        """Delete data files and staging left by runs that never wrote their marker; return them.

        Also what a failed run had already moved: it has no marker either.
        """
        committed = {m.run_id for m in self.markers(every_topic=True)}
        removed = []
        for info in self.fs.get_file_info(pafs.FileSelector(self.root, recursive=True, allow_not_found=True)):
            rel = info.path[len(self.root) + 1 :]
            if not info.is_file or rel.startswith((MARKERS, STAGING)) or not rel.endswith(".parquet"):
                continue
            run_id = info.base_name.split("-part-", 1)[0]
            if "-part-" in info.base_name and run_id not in committed:
                self.fs.delete_file(info.path)
                removed.append(rel)
        self.fs.delete_dir_contents(f"{self.root}/{STAGING}", missing_dir_ok=True)
        return removed

    def commit(self, run_id: str, topic_id: str, ranges: dict[int, tuple[int, int]]) -> Marker:
        """Move the run's staged files into place, then write its marker (the commit point)."""
        staged = self.staging(run_id)
        files = []
        rows = 0
        for info in self.fs.get_file_info(pafs.FileSelector(staged, recursive=True, allow_not_found=True)):
            if not info.is_file or not info.base_name.endswith(".parquet"):
                continue
            rel_dir = info.path[len(staged) + 1 :].rsplit("/", 1)[0]
            target = f"{rel_dir}/{run_id}-{info.base_name}"
            self.fs.create_dir(f"{self.root}/{rel_dir}", recursive=True)
            rows += pq.read_metadata(info.path, filesystem=self.fs).num_rows
            self.fs.move(info.path, f"{self.root}/{target}")
            files.append(target)
        seq = max((m.seq for m in self.markers()), default=0) + 1
        marker = Marker(seq, run_id, self.topic, topic_id, ranges, sorted(files), rows)
        body = json.dumps({
            "seq": seq, "run_id": run_id, "topic": self.topic, "topic_id": topic_id,
            "ranges": {str(p): list(r) for p, r in ranges.items()}, "files": marker.files, "rows": rows,
            "committed_ms": int(time.time() * 1000),
        }, indent=1).encode()  # fmt: skip
        self.fs.create_dir(self._markers_dir(), recursive=True)
        tmp = f"{self._markers_dir()}/.{run_id}.tmp"
        with self.fs.open_output_stream(tmp) as f:
            f.write(body)
        self.fs.move(tmp, f"{self._markers_dir()}/{seq:08d}-{run_id}.json")
        self.fs.delete_dir_contents(staged, missing_dir_ok=True)
        self.fs.delete_dir(staged)
        return marker


def new_run_id() -> str:
    return f"run{time.strftime('%Y%m%dT%H%M%S')}{uuid.uuid4().hex[:8]}"
