"""The proxy's byte budgets and its one memory bound (reader/proxy/budget.py, reader/proxy/config.py)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import yaml

from reader.proxy import load_proxy_settings
from reader.proxy.budget import SMALL_FRAME, ByteBudget
from tiering_core.errors import ConfigError

MIB = 1 << 20


def test_waits_are_first_come_first_served_and_small_frames_never_wait() -> None:
    async def run() -> list[str]:
        budget = ByteBudget(10 * MIB)
        assert budget.take_now(8 * MIB)
        order: list[str] = []

        async def take(name: str, n: int) -> None:
            await budget.take(n)
            order.append(name)

        large = asyncio.create_task(take("large", 6 * MIB))
        await asyncio.sleep(0)
        assert not budget.take_now(1 * MIB), "a later frame went before the one waiting"
        assert budget.take_now(SMALL_FRAME), "a small frame waited"
        later = asyncio.create_task(take("later", 1 * MIB))
        await asyncio.sleep(0)
        assert order == []
        budget.release(8 * MIB)
        await asyncio.gather(large, later)
        assert budget.used == 7 * MIB + SMALL_FRAME
        return order

    assert asyncio.run(run()) == ["large", "later"]


def test_a_frame_larger_than_the_budget_waits_for_an_empty_one() -> None:
    async def run() -> None:
        budget = ByteBudget(4 * MIB)
        assert budget.take_now(1 * MIB)
        task = asyncio.create_task(budget.take(6 * MIB))
        await asyncio.sleep(0)
        assert not task.done()
        budget.release(1 * MIB)
        await task
        assert budget.used == 6 * MIB

    asyncio.run(run())


def test_a_cancelled_wait_takes_nothing_and_lets_the_next_one_in() -> None:
    async def run() -> None:
        budget = ByteBudget(4 * MIB)
        assert budget.take_now(3 * MIB)
        first = asyncio.create_task(budget.take(3 * MIB))
        second = asyncio.create_task(budget.take(1 * MIB))
        await asyncio.sleep(0)
        first.cancel()
        await asyncio.gather(first, return_exceptions=True)
        await second
        assert budget.used == 4 * MIB and not budget.waiters

    asyncio.run(run())


def test_take_upto_gives_what_is_free_and_force_counts_beyond() -> None:
    budget = ByteBudget(4 * MIB)
    assert budget.take_upto(3 * MIB) == 3 * MIB
    assert budget.take_upto(3 * MIB) == 1 * MIB
    assert budget.take_upto(1) == 0
    budget.force(MIB)
    assert budget.used == 5 * MIB and budget.peak == 5 * MIB


def _config(tmp_path: Path, **proxy: object) -> Path:
    path = tmp_path / "proxy.yaml"
    path.write_text(yaml.safe_dump({"bootstrap_servers": "127.0.0.1:9092", "proxy": proxy,
                                    "remote_storage": {"kind": "s3", "bucket": "b"}}))  # fmt: skip
    return path


def test_the_defaults_fit_their_memory_bound(tmp_path: Path) -> None:
    settings = load_proxy_settings(_config(tmp_path))
    assert settings.memory_needed() <= settings.proxy.max_memory_bytes


@pytest.mark.parametrize(
    ("proxy", "named"),
    [
        ({"max_memory_bytes": 512 * MIB}, ["max_memory_bytes", "prefetch_pool_bytes", "max_connections"]),
        ({"answer_buffer_bytes": 64 * MIB}, ["answer_buffer_bytes", "fetch_max_bytes"]),
        ({"request_buffer_bytes": 64 * MIB}, ["request_buffer_bytes", "max_frame_bytes"]),
    ],
    ids=["memory", "answers", "requests"],
)
def test_inconsistent_bounds_are_a_config_error_naming_the_fields(tmp_path: Path, proxy: dict,
                                                                  named: list[str]) -> None:  # fmt: skip
    with pytest.raises(ConfigError) as raised:
        load_proxy_settings(_config(tmp_path, **proxy))
    for name in named:
        assert name in str(raised.value)
