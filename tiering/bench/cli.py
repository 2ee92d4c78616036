"""``tiering bench``: the benchmark commands, one module each."""

from __future__ import annotations

import click

from deploy.bench_stack import exit_on_signals
from tiering.bench.catchup import catchup
from tiering.bench.decode import decode
from tiering.bench.export import export
from tiering.bench.fetch_service import http_bench
from tiering.bench.metadata import metadata
from tiering.bench.proxy import proxy_bench
from tiering.bench.reassign import reassign_bench
from tiering.bench.scale import scale
from tiering.bench.upload import upload


class _ExitOnSignals(click.Group):
    """Runs the chosen benchmark inside ``exit_on_signals`` (a group callback's resources close without
    seeing the command's exception, and that exception decides the exit code)."""

    def invoke(self, ctx: click.Context) -> object:
        with exit_on_signals():
            return super().invoke(ctx)


@click.group(cls=_ExitOnSignals)
def bench() -> None:
    """Benchmarks that print JSON: ours beside a reference in the same run, with their ratio.

    Each prints one JSON object per measurement and, last, one summary object. They start the local
    stack (Kafka, MinIO, etcd) in a temporary directory unless --stack-dir names a running one, and
    stop it when they end, killed by SIGTERM or Ctrl-C included (exit code 143 or 130).
    """


bench.add_command(catchup)
bench.add_command(decode)
bench.add_command(export)
bench.add_command(http_bench)
bench.add_command(metadata)
bench.add_command(proxy_bench)
bench.add_command(scale)
bench.add_command(reassign_bench)
bench.add_command(upload)
