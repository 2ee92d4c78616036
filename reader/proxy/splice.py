"""Pass-through Fetch answers moved from the broker's socket to the client's as they arrive, without entering
the process.

A Fetch answer the proxy passes on unchanged was received whole into a buffer, then written to the client: two
more copies of every byte through the process, on the two cores the broker and the client also use, and the
answer's whole transfer waited for before its first byte went on (docs/design.md, "Zero-copy pass-through").
Here the record bytes go from the broker's socket into a kernel pipe with ``splice(2)`` and from the pipe to
the client's socket the same way, a chunk at a time as they arrive (cut-through); only the headers around them
(``fetch_scan.fetch_walk``) are read into the process, and written into the pipe in their place.

Every change a pass-through answer can need is small and comes before the bytes it governs, so it is made in
place, the same size (the size prefix has gone out first), by the Fetch handler (``Gate``):

- the top-level error comes first: an answer refused as a whole is read into a buffer before anything goes
  out, and completed as every answer was;
- a partition's header comes before its records: one with an error is shown to ``Gate.partition`` before it
  goes out (OFFSET_OUT_OF_RANGE for an offset the remote copies hold becomes NONE with no records and the
  broker's current offsets, so the client asks again and is served from remote);
- the node endpoints (Fetch v16+, KIP-951) come last: ``Gate.tagged`` rewrites them to the proxy's addresses
  at the same size.

An answer that breaks its own lengths before anything went out is read into a buffer (the handler names what
is wrong); after, the connection closes, as for any broken frame. Both sides must be plain TCP (``splice``
cannot see through TLS); a TLS side keeps the buffered path.

The pipes are the server's (``PipePool``): one is borrowed per answer and given back empty, so the number of
pipes (two descriptors each) does not grow with the connections; an answer that finds none is buffered. The
sockets are read and written through duplicates of their descriptors, registered with the event loop for the
answer's duration only, while the connection's transports are idle (an event loop lets one owner watch a
descriptor).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import struct
import termios
from collections.abc import Callable
from typing import NamedTuple, Protocol

from reader.proxy.fetch_scan import ScannedFetch, ScannedPartition, fetch_walk, top_step
from reader.proxy.wire import ProtocolError
from tiering_core.logs import get_logger

log = get_logger(__name__)
_FLAGS = os.SPLICE_F_MOVE | os.SPLICE_F_NONBLOCK if hasattr(os, "splice") else 0
_READ_AHEAD = 512  # header bytes asked of the socket at a time (records beyond them come along, in order)
_INT = struct.Struct("i")
_FIXED_AT = 4  # a partition header's fixed fields after partition_index: error_code, offsets (``Gate.partition``)


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


class PipePool:
    """At most ``limit`` kernel pipes of ``size`` bytes, lent per answer (``borrow``) and given back empty."""

    def __init__(self, limit: int, size: int) -> None:
        self.limit, self.size = limit, size
        self.idle: list[Pipe] = []
        self.made = 0

    def borrow(self) -> Pipe | None:
        """A pipe, or None when all ``limit`` are lent (the answer takes the buffered path)."""
        if self.idle:
            return self.idle.pop()
        if self.made >= self.limit:
            return None
        read, write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        with contextlib.suppress(OSError):  # beyond fs.pipe-max-size: the kernel's default size stays
            fcntl.fcntl(write, fcntl.F_SETPIPE_SZ, self.size)
        self.made += 1
        return Pipe(read, write)

    def give_back(self, pipe: Pipe) -> None:
        """A pipe after its answer: kept if it is empty, closed if not (a connection that broke half way)."""
        if _pending(pipe.read):
            os.close(pipe.read)
            os.close(pipe.write)
            self.made -= 1
        else:
            self.idle.append(pipe)

    def close(self) -> None:
        for pipe in self.idle:
            os.close(pipe.read)
            os.close(pipe.write)
        self.made -= len(self.idle)
        self.idle.clear()


class Gate(Protocol):
    """What the Fetch handler decides while its answer goes through."""

    async def partition(self, partition: ScannedPartition) -> bytes | None:
        """A partition header with an error, before it goes out: None leaves it, else the bytes written in
        place from its error_code on (error_code, high_watermark, last_stable_offset[, log_start_offset])."""
        ...

    def tagged(self, section: bytes) -> bytes:
        """The answer's top-level tagged fields (node endpoints), rewritten to the same number of bytes."""
        ...

    async def passed(self, scan: ScannedFetch) -> None:
        """The whole answer walked, before its last bytes go out (the client's next request sees what it
        taught the proxy)."""
        ...


class Passed(NamedTuple):
    """An answer that went out: its scan, and whether the gate changed anything in it."""

    scan: ScannedFetch
    changed: bool


class _Hold(Exception):
    """Nothing has gone out and the answer must be read whole (a top-level error, a wrong correlation id)."""


class Relay:
    """One answer's way through a pipe (``relay``); ``close`` gives the pipe back whatever happened."""

    def __init__(self, pool: PipePool, broker: int, client: int) -> None:
        self.pool = pool
        self.broker = os.dup(broker)
        try:
            self.client = os.dup(client)
        except OSError:  # out of descriptors: the connection closes, nothing left open
            os.close(self.broker)
            raise
        self.pipe = pool.borrow()
        self.loop = asyncio.get_running_loop()
        self.sent = False  # a byte of the answer went to the client: it can no longer be read whole

    def close(self) -> None:
        if self.pipe is not None:
            self.pool.give_back(self.pipe)
            self.pipe = None
        os.close(self.broker)
        os.close(self.client)

    async def relay(self, head: bytes, size: int, version: int, correlation_id: int, gate: Gate,
                    timeout: float) -> Passed | bytearray:  # fmt: skip
        """The Fetch answer of ``version`` whose size prefix (``head``, ``size`` bytes to come) was read: sent on
        to the client as it arrives (``Passed``), or read into a buffer, size prefix first, where nothing went
        out yet and it must be read whole (no pipe free, a top-level error, an answer that cannot be walked).
        A client that takes nothing for ``timeout`` seconds raises TimeoutError; an answer that breaks after
        bytes went out raises ProtocolError."""
        state = _Passage(self, size, timeout)
        state.out += head
        if self.pipe is None:
            return await state.whole()
        try:
            passed = await state.walk(version, correlation_id, gate)
            await gate.passed(passed.scan)
            await state.flush()
            await state.pump()
            return passed
        except (_Hold, ProtocolError) as exc:
            if self.sent:
                raise
            if isinstance(exc, ProtocolError):
                log.info("a Fetch answer is read whole: its scan failed", error=str(exc))
            return await state.whole()

    async def ready(self, add: Callable[..., None], remove: Callable[[int], bool], fd: int) -> None:
        future = self.loop.create_future()
        add(fd, lambda: future.done() or future.set_result(None))
        try:
            await future
        finally:
            remove(fd)


class _Passage:
    """One answer on its way: what is still in the socket (``left``), header bytes read ahead and not walked
    yet (``ahead`` from ``at``), walked bytes not yet in the pipe (``out``, its last step's bytes from
    ``mark``)."""

    def __init__(self, relay: Relay, size: int, timeout: float) -> None:
        self.relay = relay
        self.size = size
        self.timeout = timeout
        self.left = size
        self.ahead = bytearray()
        self.at = 0
        self.out = bytearray()
        self.mark = 0
        self.in_pipe = 0  # bytes in the pipe, not yet sent

    async def walk(self, version: int, correlation_id: int, gate: Gate) -> Passed:
        walk = fetch_walk(version, header=True)
        step = next(walk)
        changed, first = False, True
        try:
            while True:
                if isinstance(step, ScannedPartition):
                    if step.error_code and (fixed := await gate.partition(step)) is not None:
                        at = self.mark + _FIXED_AT
                        self.out[at : at + len(fixed)] = fixed
                        changed = True
                    await self._records(step.records)
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
                self.mark = len(self.out)
                self.out += memoryview(self.ahead)[self.at : end]
                self.at = end
                if first and value != correlation_id:  # the response header: the connection closes on it
                    raise _Hold
                first = False
                if top_step(step) and value:
                    raise _Hold
                step = walk.send(value)
        except StopIteration as stop:
            scan: ScannedFetch = stop.value
        if self.left or self.at != len(self.ahead):
            raise ProtocolError(f"a Fetch v{version} answer has bytes after its fields")
        if scan.tagged:
            section = bytes(self.out[self.mark :])
            rewritten = gate.tagged(section)
            if len(rewritten) != len(section):
                raise ProtocolError("node endpoints rewritten to another size")  # a bug: the size went out
            self.out[self.mark :] = rewritten
            changed = changed or rewritten != section
        return Passed(scan, changed)

    async def _read_ahead(self) -> None:
        if self.at:
            del self.ahead[: self.at]
            self.at = 0
        while True:
            try:
                data = os.read(self.relay.broker, min(self.left, _READ_AHEAD))
            except BlockingIOError:
                await self._readable()
                continue
            if not data:
                raise ConnectionError("the broker closed the connection inside an answer")
            self.ahead += data
            self.left -= len(data)
            return

    async def _records(self, size: int) -> None:
        """``size`` record bytes: those read ahead with the headers, then the rest spliced through the pipe to
        the client as they arrive."""
        have = min(size, len(self.ahead) - self.at)
        self.out += memoryview(self.ahead)[self.at : self.at + have]
        self.at += have
        size -= have
        if not size:
            return
        if size > self.left:
            raise ProtocolError(f"a Fetch answer's records ({size} bytes) go past its end ({self.left} bytes)")
        await self.flush()
        await self._move(size, hold_last=True)

    async def flush(self) -> None:
        """Walked bytes into the pipe, in order (sending what it holds when it is full)."""
        pipe = self.relay.pipe
        assert pipe is not None
        while self.out:
            try:
                n = os.write(pipe.write, self.out)
            except BlockingIOError:
                await self._move(0)
                continue
            del self.out[:n]
            self.in_pipe += n
        self.mark = 0

    async def pump(self) -> None:
        """What the pipe holds, to the client."""
        await self._move(0)

    async def _move(self, size: int, hold_last: bool = False) -> None:
        """Empty the pipe to the client, then move ``size`` bytes from the broker's socket through it, a chunk at
        a time as they arrive; with ``hold_last`` the answer's last chunk stays in the pipe (``Gate.passed``
        comes first).

        Driven by the event loop's readiness callbacks (no task switch per chunk, the descriptors registered
        for this call only): each turn sends what the pipe holds and, once it is empty, takes what the socket
        has."""
        relay, pipe = self.relay, self.relay.pipe
        assert pipe is not None
        loop, done = relay.loop, relay.loop.create_future()
        watching: list[tuple[Callable[[int], bool], int]] = []

        def watch(add: Callable[..., None], remove: Callable[[int], bool], fd: int) -> None:
            for unwatch, old in watching:
                unwatch(old)
            watching[:] = [(remove, fd)]
            add(fd, turn)

        def turn() -> None:
            nonlocal size
            try:
                while True:
                    if self.in_pipe and not (hold_last and not self.left):  # the last chunk may wait
                        try:
                            self.in_pipe -= os.splice(pipe.read, relay.client, self.in_pipe, flags=_FLAGS)
                        except BlockingIOError:
                            watch(loop.add_writer, loop.remove_writer, relay.client)
                            return
                        relay.sent = True
                        continue
                    if not size:
                        break
                    try:
                        n = os.splice(relay.broker, pipe.write, size, flags=_FLAGS)
                    except BlockingIOError:
                        watch(loop.add_reader, loop.remove_reader, relay.broker)
                        return
                    if not n:
                        raise ConnectionError("the broker closed the connection inside an answer")
                    size -= n
                    self.left -= n
                    self.in_pipe += n
            except OSError as exc:  # the broker or the client gone: the awaiting coroutine raises it
                if not done.done():
                    done.set_exception(exc)
                return
            if not done.done():
                done.set_result(None)

        turn()
        try:
            async with asyncio.timeout(self.timeout):
                await done
        finally:
            for unwatch, fd in watching:
                unwatch(fd)

    async def _readable(self) -> None:
        await self.relay.ready(self.relay.loop.add_reader, self.relay.loop.remove_reader, self.relay.broker)

    async def whole(self) -> bytearray:
        """The answer in a buffer (nothing of it went out): what the pipe holds, what was walked and read ahead,
        then the rest from the socket."""
        frame = bytearray(4 + self.size)
        view, filled = memoryview(frame), 0
        pipe = self.relay.pipe
        while pipe is not None and (n := _pending(pipe.read)):
            filled += os.readv(pipe.read, [view[filled : filled + n]])
        for piece in (self.out, memoryview(self.ahead)[self.at :]):
            view[filled : filled + len(piece)] = piece
            filled += len(piece)
        while filled < len(frame):
            try:
                n = os.readv(self.relay.broker, [view[filled:]])
            except BlockingIOError:
                await self._readable()
                continue
            if not n:
                raise ConnectionError("the broker closed the connection inside an answer")
            filled += n
        return frame


def _pending(fd: int) -> int:
    """Bytes waiting to be read in a pipe or a socket (FIONREAD)."""
    return _INT.unpack(fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0"))[0]
