"""``tiering sidecar run``: the sidecar process beside a broker."""

from __future__ import annotations

from pathlib import Path

import click

from tiering.cli.common import config_option
from tiering.cli.log_options import LEVELS, service_logging
from tiering.config import load_settings
from tiering.sidecar.context import SidecarContext
from tiering.sidecar.runner import Sidecar
from tiering_core.errors import TieringError
from tiering_core.logs import get_logger

log = get_logger(__name__)


@click.group()
def sidecar() -> None:
    """Run the tiered-storage sidecar beside a Kafka broker."""


@sidecar.command()
@config_option
@click.option("--log-level", type=click.Choice(LEVELS, case_sensitive=False), default=None,
              help="As the root option `tiering --log-level` [default: INFO].")  # fmt: skip
def run(config_file: Path | None, log_level: str | None) -> None:
    """Upload rolled segments of tiered topics led by this broker, enforce local and total retention.

    Configuration comes from --config (YAML/TOML) and TIERING_* environment variables. SIGTERM
    stops it gracefully: in-flight copies finish (or are swept later); nothing is lost either way.
    Everything it writes to stderr is one JSON object per line, its last words included (exit code 1).
    """
    service_logging(log_level)
    try:
        Sidecar(SidecarContext.build(load_settings(config_file))).run_forever()
    except TieringError as exc:
        log.error("sidecar stopped", error=str(exc))
        raise SystemExit(1) from None
    except Exception as exc:
        log.error("sidecar crashed", error=f"{type(exc).__name__}: {exc}", exc_info=exc)
        raise SystemExit(1) from None
