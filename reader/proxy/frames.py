"""Reading a broker's answers frame by frame with one copy of each byte.

asyncio's StreamReader copies every received chunk into a bytearray, then each ``readexactly`` copies
the frame out and moves the rest of the buffer down: three copies of a 1 MiB Fetch answer before the
proxy looks at it (py-spy: the largest part of a pass-through read). ``FrameProtocol`` is a
``BufferedProtocol``: the size prefix is read first, then the kernel writes the frame straight into a
buffer of exactly its size, which is handed on whole.
"""

from __future__ import annotations

import asyncio
import collections
import struct

_SIZE = struct.Struct(">i")


class FrameProtocol(asyncio.BufferedProtocol):
    """Frames from one connection, in order; ``next_frame()`` returns None at the end of the stream."""

    def __init__(self, max_frame: int) -> None:
        self.max_frame = max_frame
        self.transport: asyncio.Transport | None = None
        self.frames: collections.deque[bytearray | BaseException | None] = collections.deque()
        self.waiter: asyncio.Future[None] | None = None
        self.head = bytearray(4)
        self.frame: bytearray | None = None  # the frame being received (after its size)
        self.filled = 0
        self.drained: asyncio.Future[None] | None = None
        self.paused = False

    # -- receiving --------------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def get_buffer(self, sizehint: int) -> memoryview:
        if self.frame is None:
            return memoryview(self.head)[self.filled :]
        return memoryview(self.frame)[self.filled :]

    def buffer_updated(self, nbytes: int) -> None:
        self.filled += nbytes
        if self.frame is None:
            if self.filled < 4:
                return
            (size,) = _SIZE.unpack(self.head)
            if size < 0 or size > self.max_frame:
                self._push(ConnectionError(f"the broker sent a frame of {size} bytes"))
                assert self.transport is not None
                self.transport.close()
                return
            self.frame, self.filled = bytearray(size), 0
            if size:
                return
        if self.filled == len(self.frame):
            frame, self.frame, self.filled = self.frame, None, 0
            self._push(frame)

    def eof_received(self) -> bool:
        self._push(None)
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._push(exc if exc is not None else None)
        if self.drained is not None and not self.drained.done():
            self.drained.set_exception(exc or ConnectionError("connection closed"))

    def _push(self, item: bytearray | BaseException | None) -> None:
        self.frames.append(item)
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    async def next_frame(self) -> bytearray | None:
        while not self.frames:
            self.waiter = asyncio.get_running_loop().create_future()
            await self.waiter
        item = self.frames.popleft()
        if item is None:
            self.frames.appendleft(None)  # the end stays the end
        if isinstance(item, BaseException):
            raise item
        return item

    # -- sending ----------------------------------------------------------------------------------
    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        if self.drained is not None and not self.drained.done():
            self.drained.set_result(None)

    async def write(self, *parts: bytes | bytearray | memoryview) -> None:
        assert self.transport is not None
        if self.transport.is_closing():
            raise ConnectionError("the broker connection is closed")
        for part in parts:
            self.transport.write(part)
        if self.paused:
            self.drained = asyncio.get_running_loop().create_future()
            await self.drained

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()
