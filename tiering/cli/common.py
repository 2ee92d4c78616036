"""Options and helpers shared by the operator commands."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import click

from tiering.config import SidecarSettings, load_settings
from tiering.sidecar.context import SidecarContext
from tiering_core.errors import TieringError

config_option = click.option(
    "--config",
    "config_file",
    type=click.Path(dir_okay=False, path_type=Path),
    envvar="TIERING_CONFIG",
    default=None,
    help="Sidecar configuration file (YAML or TOML); TIERING_* environment variables override it.",
)


def settings_from(config_file: Path | None) -> SidecarSettings:
    try:
        return load_settings(config_file)
    except TieringError as exc:
        raise click.ClickException(str(exc)) from exc


@contextmanager
def admin_context(config_file: Path | None) -> Iterator[SidecarContext]:
    """A started metadata manager (recovered, following the WAL) for one CLI command."""
    ctx = SidecarContext.build(settings_from(config_file), writes_snapshots=False)
    try:
        ctx.manager.start()
        yield ctx
    except TieringError as exc:
        raise click.ClickException(str(exc)) from exc
    finally:
        ctx.manager.close()
