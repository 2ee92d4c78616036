"""The sidecar's status file (``<state_dir>/status.json``): what ``tiering topic status`` shows
besides Kafka's offsets and the metadata, namely copy lag and the last error per partition.

Partitions are keyed by topic id and partition (``status_key``), not by name: a topic deleted and
created again under the same name is another topic, and its status must not mix with the old one's."""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

STATUS_FILE = "status.json"


@dataclass
class PartitionStatus:
    """What status.json (and so ``tiering topic status``) shows of a led partition."""

    copy_lag_bytes: int = 0
    copy_lag_segments: int = 0
    last_error: str | None = None
    last_error_ms: int | None = None
    next_retry_ms: int | None = None
    failing: dict[str, str] = field(default_factory=dict)  # operation -> its error, until it succeeds

    def as_dict(self) -> dict[str, Any]:
        """The fields as status.json holds them. Not ``dataclasses.asdict``: its deep copy took 40 ms per
        status at 2,000 partitions (measured; this takes 4 ms), and the status is written every tick."""
        return {**vars(self), "failing": dict(self.failing)}


def status_key(topic_id: str, partition: int) -> str:
    return f"{topic_id}/{partition}"


def status_document(broker_id: int, partitions: dict[str, dict[str, Any]], *,
                    sidecar: dict[str, Any] | None = None,
                    other_partitions: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:  # fmt: skip
    """``partitions``: the led partitions; ``sidecar``: its own failures (Kafka unreachable...);
    ``other_partitions``: failures of partitions it does not lead (a deleted topic's cleanup)."""
    return {"broker_id": broker_id, "updated_ms": int(time.time() * 1000), "partitions": partitions,
            "sidecar": sidecar or {}, "other_partitions": other_partitions or {}}  # fmt: skip


def write_status(state_dir: Path, doc: dict[str, Any]) -> None:
    """Replace ``<state_dir>/status.json`` atomically with ``doc``."""
    state_dir.mkdir(parents=True, exist_ok=True)
    path = state_dir / STATUS_FILE
    tmp = path.with_name(f".{STATUS_FILE}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(doc))
    tmp.replace(path)


def read_status(state_dir: Path) -> dict[str, Any]:
    """The last status the sidecar wrote, or an empty one if it never ran here."""
    try:
        return dict(json.loads((state_dir / STATUS_FILE).read_text()))
    except (FileNotFoundError, ValueError):
        return {"partitions": {}}
