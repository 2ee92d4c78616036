"""The whole tiering loop on the real stack: produce, enable, upload, local deletion, and nothing lost."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import pytest
from click.testing import CliRunner
from prometheus_client.parser import text_string_to_metric_families

from deploy.procs import free_port
from deploy.stack import Endpoints
from segment_fsm import SegmentState
from tests.conftest import create_topic
from tests.sidecar_harness import (
    decoded_offsets,
    local_offsets,
    produce_mixed,
    settings,
    snapshot_segments,
    wait_for,
    write_config,
)
from tiering.cli.main import main
from tiering.sidecar.context import SidecarContext
from tiering.sidecar.runner import Sidecar
from tiering_core.objects import SegmentRef

pytestmark = [pytest.mark.integration, pytest.mark.containers]

LOCAL_RETENTION_BYTES = 1 << 20


def test_tiering_loop_uploads_deletes_locally_and_loses_nothing(stack: Endpoints, tmp_path: Path) -> None:
    topic = create_topic(stack.bootstrap, internal_segment_bytes=256 * 1024)
    produced = produce_mixed(stack.bootstrap, topic, 200_000)
    partition_dir = Path(stack.broker(1).log_dir) / f"{topic}-0"
    originals = snapshot_segments(partition_dir, tmp_path / "originals")
    assert len(originals) > 20

    metrics_port = free_port()
    config = write_config(stack, tmp_path, metrics_port=metrics_port)
    runner = CliRunner()
    enabled = runner.invoke(
        main, ["topic", "enable", topic, "--local-retention-bytes", str(LOCAL_RETENTION_BYTES), "--config", str(config)]
    )
    assert enabled.exit_code == 0, enabled.output
    again = runner.invoke(
        main, ["topic", "enable", topic, "--local-retention-bytes", str(LOCAL_RETENTION_BYTES), "--config", str(config)]
    )
    assert again.exit_code == 0 and "already enabled" in again.output

    ctx = SidecarContext.build(settings(config))
    sidecar = Sidecar(ctx)
    sidecar.start()
    try:
        topic_id = ctx.cluster.topics([topic])[topic].topic_id

        def offsets():
            return ctx.cluster.local_offsets([(topic, 0)])[(topic, 0)]

        def caught_up() -> bool:
            task = sidecar.tasks.get((topic_id, 0))
            local = sum(p.stat().st_size for p in partition_dir.glob("*.log"))
            return (
                task is not None and task.status.copy_lag_segments == 0 and offsets().lx > 0
                and local <= LOCAL_RETENTION_BYTES + 2 * 256 * 1024
            )  # fmt: skip

        wait_for(caught_up, 240, "uploads to catch up and local retention to apply", step=sidecar.tick)
        finished = ctx.manager.segments(topic_id, 0, [SegmentState.COPY_SEGMENT_FINISHED])
        state = ctx.manager.partition_state(topic_id, 0)
        local = offsets()
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as response:
            metrics = response.read().decode()
    finally:
        sidecar.stop()
        sidecar.close()

    assert state is not None and state.remote_start_offset == 0
    ry = state.remote_end_offset
    assert ry is not None and local.lx <= ry + 1, "a hole between remote and local data"
    remote: dict[int, tuple] = {}
    for seg in finished:
        ref = SegmentRef(topic, topic_id, 0, seg.base_offset, __import__("uuid").UUID(bytes=seg.segment_id))
        body = ctx.store.get_bytes(ref.key("log"))
        assert body == originals[seg.base_offset], f"remote copy of segment {seg.base_offset} differs from the broker's"
        decoded = decoded_offsets(body, ref.key("log"))
        assert not set(decoded) & set(remote), "an offset is in two remote copies"
        remote.update(decoded)
    assert max(remote) == ry
    here = local_offsets(partition_dir, ry + 1)
    combined = {**remote, **here}
    assert sorted(combined) == list(range(local.lz)), "offsets missing from remote + local"
    for offset, (key, value, headers) in produced.items():
        assert combined[offset][:3] == (key, value, headers), f"offset {offset} differs"
    markers = [o for o, v in combined.items() if v[3]]
    assert len(markers) == 2  # the COMMIT and ABORT markers

    samples = {
        s.name: s.value
        for family in text_string_to_metric_families(metrics)
        for s in family.samples
        if s.labels == {"topic": topic, "partition": "0"}
    }
    assert samples["tiering_remote_copy_segments_total"] == len(finished)
    assert samples["tiering_remote_copy_bytes_total"] == sum(s.size for s in finished)
    assert samples["tiering_remote_copy_lag_segments"] == 0
    assert samples["tiering_local_retention_offsets_total"] == local.lx

    status = runner.invoke(main, ["topic", "status", topic, "--json", "--config", str(config)])
    assert status.exit_code == 0, status.output
    row = json.loads(status.output)["partitions"][0]
    assert (row["Rx"], row["Ry"], row["Lx"], row["Lz"]) == (0, ry, local.lx, local.lz)
    assert row["copy_lag_segments"] == 0 and row["segments"]["COPY_SEGMENT_FINISHED"] == len(finished)
