"""The real stack a benchmark runs against: a running one (``--stack-dir``) or a temporary one."""

from __future__ import annotations

import signal
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType

import click

from deploy import stack
from deploy.stack import Endpoints

stack_dir_option = click.option(
    "--stack-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Use the running local stack in this directory (default: start a temporary one).",
)


@contextmanager
def bench_stack(stack_dir: Path | None, brokers: int = 1) -> Iterator[Endpoints]:
    if stack_dir is not None:
        yield stack.start(stack_dir, brokers=brokers)
        return
    with tempfile.TemporaryDirectory(prefix="tiering-bench-") as tmp:
        try:
            yield stack.start(Path(tmp), brokers=brokers)
        finally:
            stack.stop(Path(tmp))


@contextmanager
def exit_on_signals() -> Iterator[None]:
    """Turn SIGTERM and SIGINT (Ctrl-C) into ``SystemExit(128 + signal number)``, the 143 or 130 a shell
    reports for a command killed so, while the block runs; the previous handlers are back after it.

    The default SIGTERM ends the process at once and Click turns Ctrl-C into exit code 1; raised as an
    exception instead, every ``finally`` on the way out runs: ``bench_stack`` stops the temporary stack
    it started (Kafka, MinIO and etcd run in sessions of their own, so a Ctrl-C at the terminal does
    not reach them) and each benchmark stops the servers it started. A second signal while stopping is
    ignored: the stop ends on its own (it SIGKILLs what did not exit in time).

    A signal that arrives inside a C extension's call runs the handler there, and the extension may put
    its own exception in place of the ``SystemExit`` (confluent-kafka's ``produce`` reported one as
    "TypeError: expected header key to be unicode string"): any exception leaving the block after a
    signal is turned back into the signal's exit code, chained to what the extension raised.
    """
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    received: list[int] = []

    def handler(signum: int, frame: FrameType | None) -> None:
        for sig in previous:
            signal.signal(sig, signal.SIG_IGN)
        received.append(signum)
        raise SystemExit(128 + signum)

    for sig in previous:
        signal.signal(sig, handler)
    try:
        yield
    except Exception as exc:
        if received:
            raise SystemExit(128 + received[0]) from exc
        raise
    finally:
        for sig, action in previous.items():
            signal.signal(sig, action)
