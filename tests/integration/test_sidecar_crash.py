"""kill -9 the sidecar process during uploads, several times: nothing lost, nothing twice, no orphans."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from deploy.stack import Endpoints
from segment_fsm import SegmentState
from tests.conftest import create_topic
from tests.integration.test_sidecar_policies import cli, produce, running
from tests.sidecar_harness import settings, snapshot_segments, wait_for, write_config
from tiering.sidecar.context import SidecarContext
from tiering.sidecar.runner import Sidecar
from tiering_core.objects import SegmentRef
from tiering_core.stores.s3 import S3Store

pytestmark = pytest.mark.integration


def start_sidecar(config: Path, log: Path, **env: str) -> subprocess.Popen:
    """``tiering sidecar run`` as a child process in a session of its own, its output appended to ``log``, with
    ``env`` added to the environment."""
    out = log.open("ab")
    return subprocess.Popen(
        [sys.executable, "-m", "tiering", "sidecar", "run", "--config", str(config)],
        stdout=out, stderr=subprocess.STDOUT, start_new_session=True, env={**os.environ, **env},
    )  # fmt: skip


def test_kill_9_during_uploads_loses_nothing_and_leaves_no_orphans(stack: Endpoints, tmp_path: Path) -> None:
    topic = create_topic(stack.bootstrap, internal_segment_bytes=256 * 1024)
    produce(stack.bootstrap, topic, 60_000)
    partition_dir = Path(stack.broker(1).log_dir) / f"{topic}-0"
    originals = snapshot_segments(partition_dir, tmp_path / "originals")
    config = write_config(
        stack, tmp_path, upload_bytes_per_second=1_000_000, copy_started_timeout_seconds=2, snapshot_every_records=20
    )
    cli("topic", "enable", topic, "--config", str(config))
    log = tmp_path / "sidecar.log"
    rng = random.Random(405)
    kills = 0
    for _ in range(4):
        proc = start_sidecar(config, log)
        time.sleep(rng.uniform(2.0, 4.0))  # start-up takes ~1-2 s; then it is mid-upload
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
        kills += 1
    proc = start_sidecar(config, log)
    observer = SidecarContext.build(settings(config), writes_snapshots=False)
    observer.manager.start()
    try:
        topic_id = observer.cluster.topics([topic])[topic].topic_id
        last_rolled = max(originals)

        def settled() -> bool:
            state = observer.manager.partition_state(topic_id, 0)
            return (
                state is not None and state.remote_end_offset is not None
                and state.remote_end_offset >= last_rolled - 1
                and state.segment_counts["COPY_SEGMENT_STARTED"] == 0
                and state.segment_counts["DELETE_SEGMENT_STARTED"] == 0
            )  # fmt: skip

        wait_for(settled, 240, "the restarted sidecar to finish uploads and sweep the crashed copies")
        time.sleep(3)  # one more rescan: the orphan sweep runs after the copies
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0, log.read_text()[-3000:]
        finished = observer.manager.segments(topic_id, 0, [SegmentState.COPY_SEGMENT_FINISHED])
        state = observer.manager.partition_state(topic_id, 0)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        observer.close()

    bases = [s.base_offset for s in finished]
    assert len(bases) == len(set(bases)), "a segment reached COPY_SEGMENT_FINISHED twice"
    assert bases == sorted(originals)[: len(bases)], "finished copies skip a segment"
    assert kills == 4
    assert state.segment_counts["DELETE_SEGMENT_FINISHED"] >= 1, "no kill landed mid-copy: the test proved nothing"
    expected_keys = set()
    for seg in finished:
        ref = SegmentRef(topic, topic_id, 0, seg.base_offset, uuid.UUID(bytes=seg.segment_id))
        expected_keys.update(ref.object_keys())
        assert observer.store.get_bytes(ref.key("log")) == originals[seg.base_offset]
    prefix = f"{topic}-{topic_id}/"
    assert set(observer.store.list_keys(prefix)) == expected_keys, "orphan objects remain"
    assert observer.store.incomplete_uploads(prefix) == []


def test_a_stop_mid_copy_finishes_that_copy_and_starts_nothing_else(stack: Endpoints, tmp_path: Path) -> None:
    """A stop (SIGTERM's handler calls ``stop``) while a rate-limited copy is in flight: that copy is finished
    (COPY_SEGMENT_FINISHED, so its upload is kept), and nothing after it runs: no further copy, no local
    retention (DeleteRecords), no deleted-topics janitor (DescribeCluster). Each of those can wait a whole
    request timeout for a broker that is going away with the sidecar, which made a stop outlast a pod's
    grace period."""
    topic = create_topic(stack.bootstrap, internal_segment_bytes=256 * 1024)
    produce(stack.bootstrap, topic, 20_000)
    config = write_config(stack, tmp_path, upload_bytes_per_second=128_000)  # ~2 s per segment
    cli("topic", "enable", topic, "--local-retention-bytes", "1", "--config", str(config))
    ctx = SidecarContext.build(settings(config))
    sidecar = Sidecar(ctx)
    counted = ctx.cluster.on_request
    after_stop: list[str] = []

    def on_request(api: str) -> None:
        if ctx.stopping.is_set():
            after_stop.append(api)
        if counted is not None:
            counted(api)

    ctx.cluster.on_request = on_request
    loop = threading.Thread(target=sidecar.run_forever, daemon=True)
    loop.start()
    try:
        topic_id = ctx.cluster.topics([topic])[topic].topic_id

        def copying() -> bool:
            state = ctx.manager.partition_state(topic_id, 0)
            return state is not None and state.segment_counts["COPY_SEGMENT_FINISHED"] >= 2 and (
                state.segment_counts["COPY_SEGMENT_STARTED"] == 1)  # fmt: skip

        wait_for(copying, 120, "a copy in flight after two finished")
        before = ctx.manager.partition_state(topic_id, 0).segment_counts["COPY_SEGMENT_FINISHED"]
        sidecar.stop()
        loop.join(120)
        assert not loop.is_alive(), "the sidecar did not stop"
        state = ctx.manager.partition_state(topic_id, 0)
    finally:
        if loop.is_alive():
            sidecar.stop()
            loop.join(60)
    assert state.segment_counts["COPY_SEGMENT_STARTED"] == 0, "the copy in flight was left unfinished"
    assert state.segment_counts["COPY_SEGMENT_FINISHED"] == before + 1, "a copy began after the stop"
    assert not {"DeleteRecords", "DescribeCluster"} & set(after_stop), f"requests after the stop: {after_stop}"


def test_the_sweeper_aborts_stale_incomplete_uploads_under_its_prefix_only(stack: Endpoints, tmp_path: Path) -> None:
    """What a sidecar killed mid-upload leaves: multipart uploads no object listing shows, billed until aborted."""
    config = write_config(
        stack, tmp_path, copy_started_timeout_seconds=1, remote_log_manager_incomplete_upload_abort_ms=1000
    )
    with running(config) as (ctx, sidecar):
        store = ctx.store.inner.inner  # the S3 store itself (the bucket's keys), behind the cluster's prefix
        assert isinstance(store, S3Store)
        prefix = ctx.settings.remote_storage.prefix

        def begin(key: str) -> str:
            upload = store.client.create_multipart_upload(Bucket=store.bucket, Key=key)["UploadId"]
            store.client.upload_part(Bucket=store.bucket, Key=key, UploadId=upload, PartNumber=1, Body=b"p" * 1024)
            return key

        stale = {begin(f"{prefix}/t-x-id/0/{0:020d}-{uuid.uuid4().hex}.log"),
                 begin(f"{prefix}/metadata-snapshots/wal/snapshot-1.tsnap")}  # fmt: skip
        foreign = begin(f"{prefix}-other/t-x-id/0/{0:020d}-{uuid.uuid4().hex}.log")  # another cluster's prefix
        time.sleep(1.2)  # the store's clock: the uploads above are older than the one below
        fresh = begin(f"{prefix}/t-x-id/0/{1:020d}-{uuid.uuid4().hex}.log")
        begun = {u.key: u.initiated_ms for u in store.incomplete_uploads(prefix)}
        assert begun.keys() == {*stale, foreign, fresh}
        ctx.now_ms = lambda: begun[fresh] + 500  # the fresh upload is half the abort age old, the others older
        sidecar.tick()
        left = {u.key for u in store.incomplete_uploads(prefix)}
        assert left == {foreign, fresh}, "stale uploads under the prefix stay, or others were aborted"
        assert ctx.metrics.registry.get_sample_value("tiering_remote_incomplete_uploads_aborted_total") == 2
        for upload in store.incomplete_uploads(prefix):
            store.abort_upload(upload)
