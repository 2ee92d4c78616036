"""Pass-through Fetch answers moved from the broker's socket to the client's without entering the process.

A Fetch answer the proxy passes on unchanged was received into a buffer and written to the client: two more
copies of every byte through the process, on the two cores the broker and the client also use. That, and the
wake-ups around it, is what bounds a store-and-forward proxy here (docs/design.md, "Zero-copy pass-through").
Here the answer's record bytes go from the broker's socket into kernel pipes with ``splice(2)`` and from the
pipes to the client's socket the same way; only the headers around them (the partition headers the proxy
must see, ``fetch_scan.fetch_walk``) are read into the process, and written into the pipe in their place.

The decision stays store-and-forward: nothing goes to the client before the whole answer is in the pipes and
its scan said it needs no change (``Slot.passes``). An answer that needs one (an error, node endpoints to
rewrite) is read out of the pipes into a buffer and completed by the Fetch handler as every answer was; so is
one for which the pipes run out (the pool is empty, or an answer larger than they hold). Both sides must be
plain TCP (``splice`` cannot see through TLS); a TLS side keeps the buffered path.

The pipes are the server's (``PipePool``): a pipe is borrowed per answer and given back empty, so the number
of pipes (two descriptors each) does not grow with the connections, and their pages are the answer's bytes,
taken from the answer budget as any received answer's are. The sockets are read and written through
duplicates of their descriptors, registered with the event loop for the answer's duration only, while the
connection's transports are paused (an event loop lets one owner watch a descriptor).
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import struct
import termios
from collections.abc import Callable
from typing import NamedTuple

from reader.proxy.fetch_scan import ScannedFetch, fetch_walk
from reader.proxy.wire import ProtocolError
from tiering_core.logs import get_logger

log = get_logger(__name__)
_FLAGS = os.SPLICE_F_MOVE | os.SPLICE_F_NONBLOCK if hasattr(os, "splice") else 0
_READ_AHEAD = 512  # header bytes asked of the socket at a time (records beyond them come along, in order)
_INT = struct.Struct("i")


def pipe_max_size() -> int:
    """The largest pipe an unprivileged process may make (Linux' fs.pipe-max-size; 1 MiB by default)."""
    try:
        with open("/proc/sys/fs/pipe-max-size") as f:
            return int(f.read())
    except (OSError, ValueError):
        return 1 << 20


class Pipe(NamedTuple):
    read: int
    write: int
    capacity: int


class PipePool:
    """At most ``limit`` kernel pipes of ``size`` bytes, lent per answer (``borrow``) and given back empty."""

    def __init__(self, limit: int, size: int) -> None:
        self.limit, self.size = limit, size
        self.idle: list[Pipe] = []
        self.made = 0

    @property
    def answer_bytes(self) -> int:
        """The largest answer that may try the pipes: all of them (one that finds too few, or whose pages fill
        them less well, is buffered half way)."""
        return self.limit * self.size - 4

    def borrow(self) -> Pipe | None:
        """A pipe, or None when all ``limit`` are lent (the answer takes the buffered path)."""
        if self.idle:
            return self.idle.pop()
        if self.made >= self.limit:
            return None
        read, write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            capacity = fcntl.fcntl(write, fcntl.F_SETPIPE_SZ, self.size)
        except OSError:  # beyond fs.pipe-max-size: the kernel's default size
            capacity = fcntl.fcntl(write, fcntl.F_GETPIPE_SZ)
        self.made += 1
        return Pipe(read, write, capacity)

    def give_back(self, pipe: Pipe) -> None:
        """A pipe after its answer: kept if it is empty, closed if not (a connection that broke half way)."""
        if _pending(pipe.read):
            self._close(pipe)
        else:
            self.idle.append(pipe)

    def _close(self, pipe: Pipe) -> None:
        os.close(pipe.read)
        os.close(pipe.write)
        self.made -= 1

    def close(self) -> None:
        for pipe in self.idle:
            self._close(pipe)
        self.idle.clear()


class Spliced(NamedTuple):
    """An answer in the pipes, scanned; ``send`` moves it to the client, ``take`` reads it into the process."""

    scan: ScannedFetch
    pipes: list[Pipe]
    size: int  # its size prefix included


class Relay:
    """One answer's way through the pipes: received by ``receive``, then either sent on (``send``) or read
    into a buffer (``take``). ``close`` gives the pipes back whatever happened."""

    def __init__(self, pool: PipePool, broker: int, client: int) -> None:
        self.pool = pool
        self.broker = os.dup(broker)
        self.client = os.dup(client)
        self.pipes: list[Pipe] = []
        self.loop = asyncio.get_running_loop()

    def close(self) -> None:
        for pipe in self.pipes:
            self.pool.give_back(pipe)
        self.pipes.clear()
        os.close(self.broker)
        os.close(self.client)

    # -- receiving ----------------------------------------------------------------------------------
    async def receive(self, head: bytes, size: int, version: int) -> Spliced | bytearray:
        """The Fetch answer of ``version`` whose size prefix (``head``, ``size`` bytes to come) was read: in the
        pipes and scanned, or in a buffer (size prefix included) where the pipes ran out or the answer could
        not be walked (the Fetch handler then names what is wrong)."""
        state = _Receiving(self, size)
        state.out += head
        try:
            scan = await state.walk(version)
            state.flush()
        except (_NoRoom, ProtocolError) as exc:
            if isinstance(exc, ProtocolError):
                log.info("a Fetch answer is read whole: its scan failed", error=str(exc))
            return await state.whole()
        return Spliced(scan, list(self.pipes), 4 + size)

    async def readable(self) -> None:
        await self._ready(self.loop.add_reader, self.loop.remove_reader, self.broker)

    async def _ready(self, add: Callable[..., None], remove: Callable[[int], bool], fd: int) -> None:
        future = self.loop.create_future()
        add(fd, lambda: future.done() or future.set_result(None))
        try:
            await future
        finally:
            remove(fd)

    # -- sending --------------------------------------------------------------------------------------
    async def send(self, spliced: Spliced, timeout: float) -> None:
        """Move the answer from the pipes to the client; a client that takes nothing for ``timeout`` seconds
        raises TimeoutError."""
        for pipe in spliced.pipes:
            while left := _pending(pipe.read):
                try:
                    os.splice(pipe.read, self.client, left, flags=_FLAGS)
                except BlockingIOError:
                    async with asyncio.timeout(timeout):
                        await self._ready(self.loop.add_writer, self.loop.remove_writer, self.client)

    def take(self, spliced: Spliced) -> bytearray:
        """The answer read out of the pipes (its size prefix first): one that needs a change after all."""
        frame = bytearray(spliced.size)
        view, filled = memoryview(frame), 0
        for pipe in spliced.pipes:
            while n := _pending(pipe.read):
                filled += os.readv(pipe.read, [view[filled : filled + n]])
        if filled != spliced.size:
            raise ProtocolError(f"a Fetch answer of {spliced.size} bytes came out of its pipes as {filled}")
        return frame


class _NoRoom(Exception):
    """The pipes are full (or none is left): the answer goes on in a buffer."""


class _Receiving:
    """The state of one answer being received: what is still in the socket (``left``), header bytes read
    ahead and not walked yet (``ahead``), walked bytes not yet in the pipe (``out``)."""

    def __init__(self, relay: Relay, size: int) -> None:
        self.relay = relay
        self.size = size
        self.left = size
        self.ahead = bytearray()
        self.at = 0  # walked up to here in ``ahead``
        self.out = bytearray()

    async def walk(self, version: int) -> ScannedFetch:
        walk = fetch_walk(version, header=True)
        step = next(walk)
        try:
            while True:
                if isinstance(step, int):
                    await self._records(step)
                    step = walk.send(None)
                    continue
                try:
                    value, end = step(self.ahead, self.at)
                    if end > len(self.ahead):
                        raise IndexError("past the bytes read")
                except (IndexError, struct.error, ProtocolError):
                    if not self.left:
                        raise ProtocolError(f"a Fetch v{version} answer ends inside its fields") from None
                    await self._read_ahead()
                    continue
                self.out += memoryview(self.ahead)[self.at : end]
                self.at = end
                step = walk.send(value)
        except StopIteration as stop:
            if self.left or self.at != len(self.ahead):
                raise ProtocolError(f"a Fetch v{version} answer has bytes after its fields") from None
            return stop.value  # type: ignore[no-any-return]

    async def _read_ahead(self) -> None:
        if self.at:
            del self.ahead[: self.at]
            self.at = 0
        while True:
            try:
                data = os.read(self.relay.broker, min(self.left, _READ_AHEAD))
            except BlockingIOError:
                await self.relay.readable()
                continue
            if not data:
                raise ConnectionError("the broker closed the connection inside an answer")
            self.ahead += data
            self.left -= len(data)
            return

    async def _records(self, size: int) -> None:
        """``size`` record bytes: those read ahead with the headers, then the rest spliced into the pipes."""
        have = min(size, len(self.ahead) - self.at)
        self.out += memoryview(self.ahead)[self.at : self.at + have]
        self.at += have
        size -= have
        if not size:
            return
        if size > self.left:
            raise ProtocolError(f"a Fetch answer's records ({size} bytes) go past its end ({self.left} bytes)")
        self.flush()
        while size:
            pipe = self._pipe()
            try:
                n = os.splice(self.relay.broker, pipe.write, size, flags=_FLAGS)
            except BlockingIOError:
                if _pending(self.relay.broker):  # bytes wait in the socket: the pipe is full, take another
                    self._next_pipe()
                else:
                    await self.relay.readable()
                continue
            if not n:
                raise ConnectionError("the broker closed the connection inside an answer")
            size -= n
            self.left -= n

    def flush(self) -> None:
        """Walked bytes into the pipes, in order. Raises _NoRoom where no pipe has room."""
        while self.out:
            pipe = self._pipe()
            try:
                n = os.write(pipe.write, self.out)
            except BlockingIOError:
                self._next_pipe()
                continue
            del self.out[:n]

    def _pipe(self) -> Pipe:
        if not self.relay.pipes:
            self._next_pipe()
        return self.relay.pipes[-1]

    def _next_pipe(self) -> None:
        pipe = self.relay.pool.borrow()
        if pipe is None:
            raise _NoRoom
        self.relay.pipes.append(pipe)

    async def whole(self) -> bytearray:
        """The answer in a buffer: what the pipes hold, what was read ahead, then the rest from the socket."""
        frame = bytearray(4 + self.size)
        view, filled = memoryview(frame), 0
        for pipe in self.relay.pipes:
            while n := _pending(pipe.read):
                filled += os.readv(pipe.read, [view[filled : filled + n]])
        for piece in (self.out, memoryview(self.ahead)[self.at :]):
            view[filled : filled + len(piece)] = piece
            filled += len(piece)
        while filled < len(frame):
            try:
                n = os.readv(self.relay.broker, [view[filled:]])
            except BlockingIOError:
                await self.relay.readable()
                continue
            if not n:
                raise ConnectionError("the broker closed the connection inside an answer")
            filled += n
        return frame


def _pending(fd: int) -> int:
    """Bytes waiting to be read in a pipe or a socket (FIONREAD)."""
    return _INT.unpack(fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0"))[0]
