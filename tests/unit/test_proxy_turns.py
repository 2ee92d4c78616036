"""FetchTurns: one Fetch's Python work per event-loop iteration, in arrival order (reader/proxy/turns.py)."""

from __future__ import annotations

import asyncio

from reader.proxy.turns import FetchTurns


def _ticking(ticks: list[int], stop: asyncio.Event) -> None:
    """Count loop iterations: a callback that schedules itself again runs once per iteration."""
    loop = asyncio.get_running_loop()

    def tick() -> None:
        ticks[0] += 1
        if not stop.is_set():
            loop.call_soon(tick)

    loop.call_soon(tick)


def test_requests_arriving_together_get_one_turn_per_iteration_in_order() -> None:
    async def main() -> list[tuple[int, int]]:
        turns, ticks, stop, entered = FetchTurns(), [0], asyncio.Event(), []
        _ticking(ticks, stop)

        async def fetch(n: int) -> None:
            async with turns:
                entered.append((n, ticks[0]))

        await asyncio.gather(*(fetch(n) for n in range(20)))
        stop.set()
        return entered

    entered = asyncio.run(main())
    assert [n for n, _ in entered] == list(range(20)), "turns out of arrival order"
    iterations = [tick for _, tick in entered]
    assert len(set(iterations)) == 20, f"two turns in one iteration: {iterations}"


def test_another_task_runs_between_two_turns() -> None:
    """The point of it: a ListOffsets handler woken during a burst runs before the burst's next Fetch."""

    async def main() -> list[str]:
        turns, order = FetchTurns(), []

        async def fetch(n: int) -> None:
            async with turns:
                order.append(f"fetch-{n}")

        async def offsets() -> None:
            await asyncio.sleep(0)
            order.append("offsets")

        await asyncio.gather(*(fetch(n) for n in range(10)), offsets())
        return order

    order = asyncio.run(main())
    assert order.index("offsets") < 3, order


def test_a_cancelled_waiter_gives_its_turn_to_the_next() -> None:
    async def main() -> list[int]:
        turns, entered = FetchTurns(), []

        async def fetch(n: int) -> None:
            async with turns:
                entered.append(n)

        tasks = [asyncio.create_task(fetch(n)) for n in range(3)]
        await asyncio.sleep(0)  # all three waiting
        tasks[1].cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        return entered

    assert asyncio.run(main()) == [0, 2]


def test_a_lone_fetch_takes_its_turn_at_once_and_the_next_waits_for_the_next_iteration() -> None:
    """One consumer reading pays no loop iteration per turn; a second turn in the same iteration still waits."""

    async def main() -> list[tuple[str, int]]:
        turns, ticks, stop, entered = FetchTurns(), [0], asyncio.Event(), []
        _ticking(ticks, stop)
        await asyncio.sleep(0)
        before = ticks[0]
        async with turns:
            entered.append(("first", ticks[0] - before))
        async with turns:
            entered.append(("second", ticks[0] - before))
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        mark = ticks[0]
        async with turns:
            entered.append(("later", ticks[0] - mark))
        stop.set()
        return entered

    entered = dict(asyncio.run(main()))
    assert entered["first"] == 0, "a lone turn waited for a loop iteration"
    assert entered["second"] >= 1, "two turns began in one iteration"
    assert entered["later"] == 0, "a turn after the others were done waited"
