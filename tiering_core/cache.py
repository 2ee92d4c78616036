"""Where the stack keeps what it downloads or builds once: ``$TIERING_CACHE_DIR`` or ~/.cache/tiering."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    root = os.environ.get("TIERING_CACHE_DIR") or str(Path.home() / ".cache" / "tiering")
    path = Path(root).expanduser()
    path.mkdir(parents=True, exist_ok=True)
    return path
