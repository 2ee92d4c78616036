"""One logging setup for every ``tiering`` command, always on stderr: stdout is the commands' output.

Long-running services (``sidecar run``, ``reader serve``) log JSON lines at INFO, for a log pipeline.
Interactive commands (topic, cluster, consume, export, demo, bench, dev) log readable lines at WARNING,
so a person sees problems (librdkafka's included) without the chatter, and stdout stays clean for
pipes (``tiering topic status --json | jq``). The root options ``--log-level`` / ``TIERING_LOG_LEVEL``
and ``--log-format`` / ``TIERING_LOG_FORMAT`` change either for every command.
"""

from __future__ import annotations

from dataclasses import dataclass

import click

from tiering_core import logs

LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
FORMATS = ("json", "text")

level_option = click.option(
    "--log-level", type=click.Choice(LEVELS, case_sensitive=False), envvar="TIERING_LOG_LEVEL", default=None,
    help="Log records at this level and above go to stderr (env TIERING_LOG_LEVEL) [default: INFO for sidecar "
    "run and reader serve, WARNING for the other commands].",
)  # fmt: skip
format_option = click.option(
    "--log-format", type=click.Choice(FORMATS), envvar="TIERING_LOG_FORMAT", default=None,
    help="json: one JSON object per line; text: readable lines (env TIERING_LOG_FORMAT) [default: json for "
    "sidecar run and reader serve, text for the other commands].",
)  # fmt: skip


@dataclass(frozen=True)
class LogOptions:
    """The root command's logging options (None: the command's default)."""

    level: str | None
    format: str | None

    def apply(self, *, service: bool, level: str | None = None) -> None:
        """Set up logging for an interactive command, or a service (``service``); ``level``: the service
        command's own ``--log-level``, which wins over the root's."""
        chosen = level or self.level or ("INFO" if service else "WARNING")
        logs.configure(chosen, json_lines=(self.format or ("json" if service else "text")) == "json")


def service_logging(level: str | None) -> None:
    """Called by a long-running command: JSON lines at INFO unless ``level`` or the root options say otherwise."""
    options = click.get_current_context().find_object(LogOptions) or LogOptions(None, None)
    options.apply(service=True, level=level)
