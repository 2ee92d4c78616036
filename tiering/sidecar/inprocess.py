"""Running a sidecar inside another command (the demo, the benchmarks) until something holds."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from tiering.config import load_settings
from tiering.sidecar.context import SidecarContext
from tiering.sidecar.runner import Sidecar


def tier_until(config: Path, done: Callable[[SidecarContext], bool], timeout: float) -> bool:
    """Start a sidecar from ``config`` in this process and tick it once a second until ``done(ctx)``
    holds (True) or ``timeout`` seconds pass (False); it is stopped and closed either way."""
    ctx = SidecarContext.build(load_settings(config))
    sidecar = Sidecar(ctx)
    sidecar.start()
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            sidecar.tick()
            if done(ctx):
                return True
            time.sleep(1)
        return False
    finally:
        sidecar.stop()
        sidecar.close()
