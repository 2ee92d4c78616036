"""Reading a broker's answers frame by frame with one copy of each byte.

asyncio's StreamReader copies every received chunk into a bytearray, then each ``readexactly`` copies
the frame out and moves the rest of the buffer down: three copies of a 1 MiB Fetch answer before the
proxy looks at it (py-spy: the largest part of a pass-through read). ``FrameProtocol`` is a
``BufferedProtocol``: the size prefix is read first, then the kernel writes the frame straight into a
buffer of its size behind that prefix, which is handed on whole (``next_frame``) and, when the proxy
changes nothing, written to the client as received in one write (``sized``).

It is also where a client that does not read its answers stops the broker (Kroxylicious toggles autoRead
the same way): reading from the broker pauses while a received answer waits for the writing task, which
itself waits until the client took the answer before (``ClientConnection._write_answers``), so a
connection holds at most two answers. Each frame's bytes are taken from the proxy's answer budget
(``reader/proxy/budget.py``) when its size arrives; without room reading stays paused until there is,
unless the connection holds no other answer: its client took everything before, and must not wait behind
clients that do not read (the proxy asks the broker for at most the room free, ``ClientConnection._fetch``).
The writing task gives them back with ``done`` once the answer is out.

A frame the writing task asked to read itself (``next_frame(unread_up_to)``, a pass-through Fetch answer that
``splice.py`` moves without reading it into the process) is left in the socket: when its size arrives and
it is the answer that task waits for, reading pauses and ``next_frame`` gives its size (``Unread``); the
task reads it from the socket and calls ``unread_done``.
"""

from __future__ import annotations

import asyncio
import collections
import struct
from typing import NamedTuple

from reader.proxy.budget import ByteBudget

_SIZE = struct.Struct(">i")
UPSTREAM_MAX_FRAME = (1 << 31) - 1  # the broker's answers are bounded by what clients ask (fetch.max.bytes)
_JOIN_BELOW = 1 << 16  # a frame up to this size is copied behind its size prefix rather than written apart


def sized(frame: memoryview) -> memoryview:
    """A frame from ``next_frame`` with its size prefix: the bytes as received, to pass on in one write."""
    whole = memoryview(frame.obj)  # type: ignore[arg-type]
    assert whole.nbytes == frame.nbytes + 4
    return whole


class Unread(NamedTuple):
    """A frame still in the socket after its size prefix (``head``): ``size`` bytes for the writing task."""

    head: bytes
    size: int


class FrameProtocol(asyncio.BufferedProtocol):
    """Frames from one connection, in order; ``next_frame()`` returns None at the end of the stream."""

    def __init__(self, max_frame: int, budget: ByteBudget) -> None:
        self.max_frame = max_frame
        self.budget = budget
        self.held = 0  # bytes taken from the budget for frames not yet done
        self.waiting: asyncio.Task[None] | None = None  # room for the frame whose size arrived
        self.transport: asyncio.Transport | None = None
        self.frames: collections.deque[bytearray | Unread | BaseException | None] = collections.deque()  # size included
        self.waiter: asyncio.Future[None] | None = None
        self.head = bytearray(4)
        self.frame: bytearray | None = None  # the frame being received, its size prefix first
        self.filled = 0
        self.drained: asyncio.Future[None] | None = None
        self.paused = False
        self.unread_up_to = 0  # the waiting task reads its answer itself if it is at most this large
        self.unread = False  # a frame waits in the socket for the writing task (``Unread``)
        self.lent = False  # the socket is lent to a native lane (``lend``): not read here

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
            if not self._take(size):
                assert self.transport is not None
                self.transport.pause_reading()
                self.waiting = asyncio.get_running_loop().create_task(self._room(size))
                return
            if self.unread_up_to >= size and not self.frames:  # the waiting writing task reads it itself
                self.held += size
                self.filled = 0
                self.unread = True
                self._push(Unread(bytes(self.head), size))
                self._flow()
                return
            self._start(size)
        if self.filled == len(self.frame):
            frame, self.frame, self.filled = self.frame, None, 0
            self._push(frame)
            self._flow()

    def _take(self, size: int) -> bool:
        """Take ``size`` bytes from the budget now if there is room, or at once if nothing else is held (the
        client took everything before: never behind clients that do not read)."""
        if self.held == 0:
            self.budget.force(size)
            return True
        return self.budget.take_now(size)

    def _start(self, size: int) -> None:
        """Receive a frame of ``size`` bytes, taken from the budget, after its size prefix (kept: an answer
        passed on unchanged goes out as one buffer, ``sized``)."""
        self.held += size
        self.frame = bytearray(4 + size)
        self.frame[:4] = self.head
        self.filled = 4

    async def _room(self, size: int) -> None:
        await self.budget.take(size)
        self.waiting = None
        self._start(size)
        self._flow()

    def _flow(self) -> None:
        """Read from the broker only while no frame waits for room and no received answer waits for the
        writing task."""
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        if (self.lent or self.unread or self.waiting is not None
                or any(isinstance(f, (bytearray, Unread)) for f in self.frames)):  # fmt: skip
            transport.pause_reading()
        else:
            transport.resume_reading()

    def done(self, size: int) -> None:
        """The writing task is finished with a frame of ``size`` bytes (its answer is out): give them back
        (unless ``close`` gave back everything already)."""
        size = min(size, self.held)
        self.held -= size
        self.budget.release(size)

    def eof_received(self) -> bool:
        self._push(None)
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._push(exc if exc is not None else None)
        if self.waiting is not None:  # no more frame comes: the answers received stay until close()
            self.waiting.cancel()
            self.waiting = None
        if self.drained is not None and not self.drained.done():
            self.drained.set_exception(exc or ConnectionError("connection closed"))

    def _push(self, item: bytearray | BaseException | None) -> None:
        self.frames.append(item)
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    async def next_frame(self, unread_up_to: int = 0) -> memoryview | Unread | None:
        """The next frame's bytes after its size prefix (``sized`` gives the whole); ``Unread`` for a frame of
        at most ``unread_up_to`` bytes whose size arrived while this call waited (the caller reads it from
        the socket, then calls ``unread_done``)."""
        self.unread_up_to = unread_up_to
        try:
            while not self.frames:
                self.waiter = asyncio.get_running_loop().create_future()
                await self.waiter
        finally:
            self.unread_up_to = 0
        item = self.frames.popleft()
        if item is None:
            self.frames.appendleft(None)  # the end stays the end
        self._flow()
        if isinstance(item, BaseException):
            try:
                raise item
            finally:  # this frame, in the error's traceback, must not hold the error: a reference cycle
                del item
        if isinstance(item, Unread):
            return item
        return None if item is None else memoryview(item)[4:]

    def unread_done(self) -> None:
        """The writing task read the ``Unread`` frame: reading goes on."""
        self.unread = False
        self._flow()

    def lend(self) -> bool:
        """Stop reading and writing here so that a native lane may use the socket (``lane.py``): only between frames,
        with nothing received or waiting to be sent; False (nothing changed) otherwise."""
        transport = self.transport
        if (transport is None or transport.is_closing() or self.frames or self.frame is not None or self.filled
                or self.unread or self.waiting is not None or transport.get_write_buffer_size()):  # fmt: skip
            return False
        self.lent = True
        self._flow()
        return True

    def take_back(self) -> None:
        """The lane let go of the socket: reading goes on."""
        self.lent = False
        self._flow()

    def socket_fd(self) -> int | None:
        """The socket's descriptor where it is plain TCP (None over TLS)."""
        transport = self.transport
        if transport is None or transport.get_extra_info("sslcontext") is not None:
            return None
        sock = transport.get_extra_info("socket")
        return None if sock is None else sock.fileno()

    # -- sending ----------------------------------------------------------------------------------
    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        if self.drained is not None and not self.drained.done():
            self.drained.set_result(None)

    async def write_frame(self, frame: bytes | memoryview) -> None:
        """Send ``frame`` after its size prefix, in one write (one system call) unless it is large."""
        assert self.transport is not None
        if self.transport.is_closing():
            raise ConnectionError("the broker connection is closed")
        if len(frame) <= _JOIN_BELOW:
            self.transport.write(_SIZE.pack(len(frame)) + frame)
        else:
            self.transport.write(_SIZE.pack(len(frame)))
            self.transport.write(frame)
        if self.paused:
            self.drained = asyncio.get_running_loop().create_future()
            await self.drained

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()
        self._free()

    def _free(self) -> None:
        """The connection is over: every byte it held goes back to the budget."""
        if self.waiting is not None:
            self.waiting.cancel()
            self.waiting = None
        self.frames = collections.deque(f for f in self.frames if not isinstance(f, bytearray))
        for item in self.frames:
            # an error a write met was raised inside asyncio's transport: its traceback's frames were called by the
            # code that wrote (``write_frame``, its frame holding this protocol and the frame being written), a
            # reference cycle while the error waits here
            if isinstance(item, BaseException):
                item.__traceback__ = None
        self.frame = None
        self.budget.release(self.held)
        self.held = 0
