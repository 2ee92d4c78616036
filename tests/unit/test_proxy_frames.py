"""The broker side of a proxy connection (``reader/proxy/frames.py``) over real TCP sockets on loopback: a broker
that resets the connection while a request is being written leaves nothing of the writer in a reference cycle
once the connection is closed."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import socket
import struct
import time
import weakref

import pytest

from reader.proxy.budget import ByteBudget
from reader.proxy.frames import FrameProtocol


class _Frame(bytearray):
    """A request's frame being forwarded (a bytearray that can be watched with a weak reference)."""


async def _forward_to_a_reset_broker(read_answer: bool) -> weakref.ref[_Frame]:
    with socket.create_server(("127.0.0.1", 0)) as listener:
        loop = asyncio.get_running_loop()
        _, upstream = await loop.create_connection(lambda: FrameProtocol(1 << 20, ByteBudget(1 << 24)),
                                                   *listener.getsockname())  # fmt: skip
        broker, _ = listener.accept()
        broker.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        broker.close()  # an RST
        time.sleep(0.1)  # blocking: the loop has not seen the reset when the write meets it

        async def forward(frame: _Frame) -> None:
            # the connection's own task: its frame holds the broker connection (as ClientConnection does)
            # and what it is forwarding; the write's error is raised inside asyncio's transport, called from here
            await upstream.write_frame(frame)
            if read_answer:
                await upstream.next_frame()  # the broker's answer: the error instead

        request = _Frame(100_000)  # large: written apart from its size prefix, as it is
        task = asyncio.create_task(forward(request))
        with contextlib.suppress(ConnectionError):
            await task
        upstream.close()
        await asyncio.sleep(0)  # the transport's connection_lost has run
        del task
        return weakref.ref(request)


@pytest.mark.parametrize("read_answer", [True, False], ids=["error-taken", "error-left"])
def test_a_broker_reset_mid_write_leaves_the_writer_in_no_reference_cycle(read_answer: bool) -> None:
    """A write to a broker that reset the connection fails inside asyncio's transport; the broker connection keeps
    that error for the writing task, and the error's traceback (its first frame called by the writing task) would
    hold that task's frame, which holds the broker connection: a cycle keeping what the task held (a request's
    frame, its answer's slot) until a collection. Whether the task took the error (``next_frame`` raised it) or
    the connection closed first, nothing is left in a cycle."""
    gc.collect()
    gc.disable()
    try:
        request = asyncio.run(_forward_to_a_reset_broker(read_answer))
        alive = request() is not None
    finally:
        gc.enable()
    assert not alive, "what the writing task held is kept by a reference cycle"


async def _forward_while_paused_to_a_reset_broker() -> weakref.ref[_Frame]:
    with socket.create_server(("127.0.0.1", 0)) as listener:
        loop = asyncio.get_running_loop()
        protocol = FrameProtocol(1 << 20, ByteBudget(1 << 24))
        _, upstream = await loop.create_connection(lambda: protocol, *listener.getsockname())
        broker, _ = listener.accept()  # reads nothing: the request fills the sockets and the transport pauses
        request = _Frame(32 << 20)
        task = asyncio.create_task(upstream.write_frame(request))
        for _ in range(200):
            await asyncio.sleep(0.01)
            if protocol.paused:
                break
        assert protocol.paused, "the transport never paused: the test would not wait on the drain"
        broker.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        broker.close()  # an RST under the paused write
        with contextlib.suppress(ConnectionError):
            await task
        upstream.close()
        await asyncio.sleep(0)
        del task
        return weakref.ref(request)


def test_a_broker_reset_under_a_paused_write_leaves_the_writer_in_no_reference_cycle() -> None:
    """A write waiting for the transport to drain (the broker reads slowly) when the broker resets the connection:
    the drain's future keeps the error, whose traceback holds the waiting write's frame (the protocol, the frame
    being written). Once the connection is closed, nothing is left in a cycle."""
    gc.collect()
    gc.disable()
    try:
        request = asyncio.run(_forward_while_paused_to_a_reset_broker())
        alive = request() is not None
    finally:
        gc.enable()
    assert not alive, "the frame being written is kept by a reference cycle"
