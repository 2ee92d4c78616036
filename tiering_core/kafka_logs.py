"""librdkafka's log lines, routed into this project's structured log.

Without a ``logger``, librdkafka prints ``%3|1700000000.123|FAIL|rdkafka#producer-1| ...`` lines to
stderr, in the middle of the JSON log. Every confluent-kafka client of the sidecar gets
``kafka_logging()`` in its configuration; the client then queues its log lines until it is polled.
Producers and consumers are polled anyway; an AdminClient is not, so ``admin_client`` hands each one
to a daemon thread that polls it twice a second (also while a call of it is failing for seconds).
That thread also destroys the AdminClients that are let go (see ``_Admin``).

librdkafka repeats a failing connection's line many times a second; a line that repeats (digits
aside: "after 3ms") is logged once per backoff step (1 s, 2 s, 4 s, ... 5 min) per client, with
``repeated``: how many were left out since the previous one.
"""

from __future__ import annotations

import atexit
import logging
import re
import threading
import time
import weakref
from collections import deque
from typing import Any

from confluent_kafka.admin import AdminClient

from tiering_core.backoff import Backoff
from tiering_core.kafka_client import make_client
from tiering_core.logs import StructuredLogger


class _Repeats:
    """Admits a line, or counts it as a repeat while its backoff step lasts. Bounded: at most ``limit``
    distinct lines are remembered (the oldest are forgotten first)."""

    def __init__(self, backoff: Backoff, limit: int = 1000) -> None:
        self.backoff = backoff
        self.limit = limit
        self.lock = threading.Lock()
        self.seen: dict[tuple[str, ...], tuple[float, int, int]] = {}  # -> (quiet until, step, left out)

    def admit(self, key: tuple[str, ...]) -> int | None:
        """None: leave the line out; else log it, saying how many were left out before it."""
        now = time.monotonic()
        with self.lock:
            entry = self.seen.pop(key, None)
            if entry is not None and now < entry[0]:
                self.seen[key] = (entry[0], entry[1], entry[2] + 1)
                return None
            quiet_for_long = entry is None or now > entry[0] + self.backoff.maximum
            step = 1 if quiet_for_long else entry[1] + 1  # type: ignore[index]
            self.seen[key] = (now + self.backoff.delay(step), step, 0)
            while len(self.seen) > self.limit:
                del self.seen[next(iter(self.seen))]
            return 0 if entry is None else entry[2]


class LibrdkafkaLogger(StructuredLogger):
    """Receives ``log(level, "%s [%s] %s", facility, client, message)`` from confluent-kafka and logs it
    as the event ``librdkafka`` with those three fields (logger name ``librdkafka``)."""

    repeats = _Repeats(Backoff(1.0, 300.0, jitter=0.0))

    def log(self, level: int, msg: object, *args: Any, **kwargs: Any) -> None:  # type: ignore[override]
        if len(args) == 3 and not kwargs:
            facility, client, message = (str(a) for a in args)
        else:
            facility, client, message = "", "", str(msg) % args if args else str(msg)
        left_out = self.repeats.admit((client, facility, _DIGITS.sub("#", message)))
        if left_out is None:
            return
        fields: dict[str, Any] = {"facility": facility, "client": client, "message": message}
        if left_out:
            fields["repeated"] = left_out
        self._log_fields(level, "librdkafka", None, fields)


_DIGITS = re.compile(r"\d+")
_LOGGER = LibrdkafkaLogger(logging.getLogger("librdkafka"), {})
_POLL_SECONDS = 0.5


def kafka_logging() -> dict[str, Any]:
    """Client configuration routing librdkafka's logs into the structured log (merge it into every
    Producer, Consumer and AdminClient configuration of the sidecar)."""
    return {"logger": _LOGGER}


class _Admin(AdminClient):
    """An AdminClient that is never destroyed on a thread of its own.

    librdkafka completes an admin call on the client's background thread, which runs the future's Python
    callback there. Python may collect garbage on any thread that allocates, so an AdminClient left in a
    reference cycle (an exception's traceback holding the frames that held it is enough) can be destroyed
    by its own background thread, and librdkafka aborts the process: "calling rd_kafka_destroy() from
    librdkafka owned thread is prohibited". So a client whose last reference goes on a thread Python did not
    start (librdkafka's: a "dummy" thread to Python) is handed to the poller's thread, which lets go of it
    there (within ``_POLL_SECONDS``); on Python's own threads, and once the poller stopped (at interpreter
    exit), it is destroyed at once. Python calls ``__del__`` once: the second time its references end, the
    client is destroyed."""

    def __del__(self) -> None:
        if isinstance(threading.current_thread(), threading._DummyThread) and not _POLLER.stopped.is_set():
            _POLLER.released.append(self)


class _AdminPoller:
    def __init__(self) -> None:
        self.clients: weakref.WeakSet[AdminClient] = weakref.WeakSet()
        self.released: deque[AdminClient] = deque()  # a deque: appended to from finalizers, without a lock
        self.lock = threading.Lock()
        self.thread: threading.Thread | None = None
        self.stopped = threading.Event()

    def add(self, admin: AdminClient) -> None:
        with self.lock:
            self.clients.add(admin)
            if self.thread is None:
                self.thread = threading.Thread(target=self._run, name="librdkafka-admin-logs", daemon=True)
                self.thread.start()

    def stop(self) -> None:
        """Stop polling (at interpreter exit: a client polled while the interpreter is torn down calls its
        Python log callback into it, which can crash the process)."""
        self.stopped.set()
        if self.thread is not None:
            self.thread.join(timeout=5)
        self._destroy_released()

    def _run(self) -> None:
        while not self.stopped.wait(_POLL_SECONDS):
            self._destroy_released()
            self._poll_once()

    def _destroy_released(self) -> None:
        while self.released:
            self.released.popleft()

    def _poll_once(self) -> None:
        """Poll each client once. Its references end with the call: a list kept in ``_run`` between rounds held
        every client polled, which then never left the weak set, and lived (connecting, logging 'Connection
        refused' once its brokers stopped) until the process ended."""
        with self.lock:
            clients = list(self.clients)
        for admin in clients:
            admin.poll(0)


_POLLER = _AdminPoller()
atexit.register(_POLLER.stop)


def admin_client(config: dict[str, Any]) -> AdminClient:
    """An AdminClient whose librdkafka log lines reach the structured log (ConfigError: see ``make_client``)."""
    admin = make_client(_Admin, {**kafka_logging(), **config})
    _POLLER.add(admin)
    return admin
