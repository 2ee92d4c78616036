"""Structured logging: one JSON object per line.

Use ``log = get_logger(__name__)`` and ``log.info("segment uploaded", topic=t, partition=p)``:
the message is the event, keyword arguments become fields of the JSON line.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any


class JsonFormatter(logging.Formatter):
    """Formats a record as a JSON line with its structured fields."""

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "event": getattr(record, "event", record.getMessage()),
        }
        doc.update(getattr(record, "fields", {}))
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return json.dumps(doc, default=str)


class StructuredLogger(logging.LoggerAdapter):
    """A logger whose methods take fields as keyword arguments."""

    def _log_fields(self, level: int, msg: str, exc_info: Any, fields: dict[str, Any]) -> None:
        if self.logger.isEnabledFor(level):
            text = " ".join([msg, *(f"{k}={v}" for k, v in fields.items())])  # readable by plain handlers too
            self.logger.log(level, text, exc_info=exc_info, extra={"fields": fields, "event": msg}, stacklevel=3)

    def debug(self, msg: str, *, exc_info: Any = None, **fields: Any) -> None:  # type: ignore[override]
        self._log_fields(logging.DEBUG, msg, exc_info, fields)

    def info(self, msg: str, *, exc_info: Any = None, **fields: Any) -> None:  # type: ignore[override]
        self._log_fields(logging.INFO, msg, exc_info, fields)

    def warning(self, msg: str, *, exc_info: Any = None, **fields: Any) -> None:  # type: ignore[override]
        self._log_fields(logging.WARNING, msg, exc_info, fields)

    def error(self, msg: str, *, exc_info: Any = None, **fields: Any) -> None:  # type: ignore[override]
        self._log_fields(logging.ERROR, msg, exc_info, fields)


def get_logger(name: str) -> StructuredLogger:
    return StructuredLogger(logging.getLogger(name), {})


class TextFormatter(logging.Formatter):
    """A readable line for a person at a terminal: time, level, logger, then the event and its fields."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")


class _Handler(logging.StreamHandler):  # type: ignore[type-arg]
    """The handler ``configure`` installs. Without a stream it writes to whatever ``sys.stderr`` is when a
    record is written, not when it was built: a command run in-process (a test's CliRunner) swaps it."""

    def __init__(self, stream: Any = None) -> None:
        super().__init__()
        self._fixed = stream

    @property  # type: ignore[override]
    def stream(self) -> Any:
        return self._fixed if self._fixed is not None else sys.stderr

    @stream.setter
    def stream(self, value: Any) -> None:
        self._fixed = value


def configure(level: str = "INFO", stream: Any = None, *, json_lines: bool = True) -> None:
    """Send every log record (this project's, librdkafka's, other libraries') at ``level`` and above to
    ``stream`` (stderr by default): JSON lines (``JsonFormatter``) or readable lines (``TextFormatter``).

    Idempotent: a handler installed by an earlier call is replaced, other handlers (a test runner's) stay.
    """
    handler = _Handler(stream)
    handler.setFormatter(JsonFormatter() if json_lines else TextFormatter())
    root = logging.getLogger()
    for previous in [h for h in root.handlers if isinstance(h, _Handler)]:
        root.removeHandler(previous)
    root.addHandler(handler)
    root.setLevel(level.upper())
