"""Entry point of the ``tiering`` command.

Sub-commands live with the code they drive and are attached here, imported lazily so that
``tiering --help`` stays fast and a missing optional dependency only breaks its own command.
"""

from __future__ import annotations

import importlib

import click

from tiering import __version__
from tiering.cli.log_options import LogOptions, format_option, level_option

# name -> (module, attribute, one-line help shown by ``tiering --help``)
_COMMANDS: dict[str, tuple[str, str, str]] = {
    "dev": ("deploy.cli", "dev", "Start, stop and inspect the local stack (Kafka, S3 server, etcd)."),
    "bench": ("tiering.bench.cli", "bench", "Benchmarks that print JSON, ours beside a reference."),
    "demo": ("tiering.cli.demo", "demo", "The quickstart: start the stack, produce, and show the loop."),
    "sidecar": ("tiering.cli.sidecar", "sidecar", "Run the sidecar beside a broker."),
    "topic": ("tiering.cli.topic", "topic", "Enable, pause, resume, roll back and inspect tiering of a topic."),
    "cluster": ("tiering.cli.topic", "cluster", "Cluster-wide pause, resume, rollback and status."),
    "reader": ("tiering.cli.reader", "reader", "Serve records of tiered topics over HTTP from remote storage."),
    "proxy": ("tiering.cli.proxy", "proxy", "Serve the Kafka protocol: any Kafka client reads tiered history."),
    "consume": ("tiering.cli.consume", "consume", "Print a topic's records, remote ones included (console consumer)."),
    "export": ("tiering.cli.export", "export", "Export tiered segments to Parquet, Delta or Iceberg with Spark."),
}


class LazyGroup(click.Group):
    """A click group whose sub-commands are imported only when used."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(_COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        spec = _COMMANDS.get(cmd_name)
        if spec is None:
            return None
        module = importlib.import_module(spec[0])
        return getattr(module, spec[1])

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, _COMMANDS[name][2]) for name in self.list_commands(ctx)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="tiering")
@level_option
@format_option
@click.pass_context
def main(ctx: click.Context, log_level: str | None, log_format: str | None) -> None:
    """Tiered storage for an existing Apache Kafka cluster.

    A sidecar beside each broker uploads rolled segments to object storage, keeps a small hot set
    on the broker's disk and serves catch-up reads from the remote copy.

    Logs go to stderr (readable lines at WARNING; JSON lines at INFO for sidecar run and reader serve),
    command output to stdout.
    """
    ctx.obj = LogOptions(log_level, log_format)
    ctx.obj.apply(service=False)
