"""The real stack a benchmark runs against: a running one (``--stack-dir``) or a temporary one."""

from __future__ import annotations

import signal
import tempfile
from collections.abc import Callable, Iterator
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


def exit_on_signals() -> Callable[[], None]:
    """Turn SIGTERM and SIGINT (Ctrl-C) into ``SystemExit(128 + signal number)``, the 143 or 130 a shell
    reports for a command killed so, and return the function that puts the previous handlers back.

    The default SIGTERM ends the process at once and Click turns Ctrl-C into exit code 1; raised as an
    exception instead, every ``finally`` on the way out runs: ``bench_stack`` stops the temporary stack
    it started (Kafka, MinIO and etcd run in sessions of their own, so a Ctrl-C at the terminal does
    not reach them) and each benchmark stops the servers it started. A second signal while stopping is
    ignored: the stop ends on its own (it SIGKILLs what did not exit in time).
    """
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}

    def handler(signum: int, frame: FrameType | None) -> None:
        for sig in previous:
            signal.signal(sig, signal.SIG_IGN)
        raise SystemExit(128 + signum)

    def restore() -> None:
        for sig, action in previous.items():
            signal.signal(sig, action)

    for sig in previous:
        signal.signal(sig, handler)
    return restore
