"""status.json's partition entries: every field of PartitionStatus, and no reference into the live status."""

from __future__ import annotations

import json
from dataclasses import asdict, fields

from tiering.sidecar.status import PartitionStatus


def test_as_dict_holds_every_field_as_asdict_does() -> None:
    status = PartitionStatus(copy_lag_bytes=7, copy_lag_segments=2, last_error="boom", last_error_ms=5,
                             next_retry_ms=9, failing={"copy": "boom"})  # fmt: skip
    assert status.as_dict() == asdict(status)
    assert set(status.as_dict()) == {f.name for f in fields(PartitionStatus)}
    json.dumps(status.as_dict())


def test_as_dict_does_not_share_the_failing_map() -> None:
    status = PartitionStatus(failing={"copy": "boom"})
    doc = status.as_dict()
    status.failing.pop("copy")
    assert doc["failing"] == {"copy": "boom"}
