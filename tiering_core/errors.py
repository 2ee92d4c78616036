"""The project's error hierarchy.

Every error names *what* failed and *where* (a file and byte position, an object key, a topic and
partition), and its docstring says what the caller should do about it.
"""

from __future__ import annotations


class TieringError(Exception):
    """Base of every error this project raises on purpose."""


class ConfigError(TieringError):
    """Configuration or a CLI argument is invalid. Fix the input; nothing was changed."""


class FormatError(TieringError):
    """Bytes that should be in one of Kafka's on-disk formats are not.

    ``path`` is the file (or object key) and ``position`` the byte offset in it where the problem
    was found. The data is never repaired or skipped silently: the caller must not upload, delete or
    serve the segment, and should report it.
    """

    def __init__(self, path: str, position: int, reason: str) -> None:
        self.path = path
        self.position = position
        self.reason = reason
        super().__init__(f"{path} at byte {position}: {reason}")


class UnsupportedFormatError(FormatError):
    """The bytes are a valid but unsupported Kafka format (legacy message format v0/v1)."""
