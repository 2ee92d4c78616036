"""Options and helpers shared by the operator commands."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import click
from confluent_kafka import KafkaException

from tiering.config import SidecarSettings, load_settings
from tiering.sidecar.context import SidecarContext
from tiering_core.errors import TieringError
from tiering_core.kafka_cluster import kafka_error_text

config_option = click.option(
    "--config",
    "config_file",
    type=click.Path(dir_okay=False, path_type=Path),
    envvar="TIERING_CONFIG",
    default=None,
    help="Sidecar configuration file (YAML or TOML); TIERING_* environment variables override it.",
)


yes_option = click.option("--yes", is_flag=True, help="Do what the command destroys without asking.")


def confirm_or_refuse(question: str, yes: bool, nothing_done: str) -> None:
    """Go on when ``yes`` or when the user confirms at a terminal; otherwise stop (exit 1) saying
    ``nothing_done``. Without a terminal on stdin there is nobody to ask: only --yes confirms."""
    if yes:
        return
    if not sys.stdin.isatty():
        raise click.ClickException(f"not confirmed (stdin is not a terminal): {nothing_done}; run again with --yes")
    if not click.confirm(question, default=False):
        raise click.ClickException(f"not confirmed: {nothing_done}")


def settings_from(config_file: Path | None) -> SidecarSettings:
    try:
        return load_settings(config_file)
    except TieringError as exc:
        raise click.ClickException(str(exc)) from exc


@contextmanager
def admin_context(config_file: Path | None) -> Iterator[SidecarContext]:
    """A started metadata manager (recovered, following the WAL) for one CLI command."""
    try:
        ctx = SidecarContext.build(settings_from(config_file), writes_snapshots=False)
    except TieringError as exc:  # no broker id in meta.properties, a store that cannot be set up...
        raise click.ClickException(str(exc)) from exc
    try:
        ctx.manager.start()
        yield ctx
    except TieringError as exc:
        raise click.ClickException(str(exc)) from exc
    except KafkaException as exc:  # a client call outside KafkaCluster's checks: a sentence, not KafkaError{...}
        raise click.ClickException(
            f"Kafka at {ctx.cluster.bootstrap} answered: {kafka_error_text(exc.args[0])}"
        ) from exc
    finally:
        ctx.manager.close()
