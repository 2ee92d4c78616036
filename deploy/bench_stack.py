"""The real stack a benchmark runs against: a running one (``--stack-dir``) or a temporary one."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

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
def bench_stack(stack_dir: Path | None) -> Iterator[Endpoints]:
    if stack_dir is not None:
        yield stack.start(stack_dir)
        return
    with tempfile.TemporaryDirectory(prefix="tiering-bench-") as tmp:
        try:
            yield stack.start(Path(tmp))
        finally:
            stack.stop(Path(tmp))
