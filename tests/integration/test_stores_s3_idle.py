"""A reader left idle longer than the S3 server keeps a connection open (MinIO closes one idle for 30 s) reads on
without taking the closed connection for an unreachable store: no GET retried, so no backoff slept (it was about
a second before the first record of a catch-up through the proxy), and every record through the proxy byte for
byte after the pause as before it. ``tiering_core/stores/s3_ranges.py`` says how."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from deploy.stack import Endpoints
from reader.fetcher import RangeFetcher
from tests.proxy_harness import check_exact, proxy_bootstrap, proxy_for, read_all
from tests.reader_harness import TieredTopic, expected, tiered_topic
from tiering_core.stores import S3Store

pytestmark = [pytest.mark.integration, pytest.mark.slow]
IDLE = 35.0  # past MinIO's 30 s


@pytest.fixture(scope="module")
def tiered(stack: Endpoints, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TieredTopic]:
    with tiered_topic(stack, tmp_path_factory.mktemp("idle"), records=20_000) as t:
        yield t


def test_readers_idle_past_the_servers_keep_alive_read_on_with_no_get_retried(
    stack: Endpoints, tiered: TieredTopic, tmp_path: Path
) -> None:
    settings = tiered.reader_settings()
    store = S3Store(settings.remote_storage)
    key = f"idle-test/{uuid.uuid4().hex}"
    body = os.urandom(1 << 20)
    store.put_bytes(key, body)
    fetcher = RangeFetcher(store, settings)  # one thread: its one kept connection is the one the server closes
    ends = {0: tiered.end_offset(0)}
    want = expected(tiered.produced, True)  # librdkafka reads read_committed by default
    with proxy_for(tiered.config, stack.bootstrap) as proxy:
        remote = proxy.reader.fetcher
        for pause in (0.0, IDLE):
            time.sleep(pause)
            assert fetcher.get(key, 1000, 1999) == body[1000:2000]
            asked = remote.requests
            got = read_all(proxy_bootstrap(proxy), tiered.topic, ends)
            check_exact([(m.offset(), (m.key(), m.value(), list(m.headers() or []))) for m in got[0]], want)
            assert remote.requests > asked, "the read through the proxy made no GET: it tested nothing"
        assert (fetcher.requests, fetcher.retries) == (2, 0)
        assert remote.retries == 0, f"{remote.retries} GETs through the proxy were sent again"
