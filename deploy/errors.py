"""Errors of the local stack."""

from __future__ import annotations

from pathlib import Path

from tiering_core.errors import TieringError


class StackError(TieringError):
    """A component of the local stack could not be installed, started or reached.

    The message names the component and, when it started, ends with the tail of its log file.
    """


def log_tail(path: Path, lines: int = 25) -> str:
    """The last ``lines`` lines of a log file, for error messages ('' when there is none)."""
    try:
        with path.open("rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - 16384))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])
