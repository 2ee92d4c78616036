"""Jars from Maven Central, fetched once with ``mvn dependency:copy-dependencies`` into the cache.

A fetch writes to ``<target>.partial`` and renames it when complete (``.complete`` marks it), so an
interrupted fetch is simply retried; a complete one is reused without touching the network.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from deploy.errors import StackError


def fetch_pom(pom: Path, target: Path, what: str, *properties: str) -> Path:
    """The runtime dependencies of ``pom`` (``-Dname=value`` ``properties``) in ``target``; return it."""
    if (target / ".complete").exists():
        return target
    mvn = shutil.which("mvn")
    if mvn is None:
        raise StackError(f"mvn not found on PATH: install Maven (apt-get install maven) to fetch {what}")
    staging = target.with_name(target.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    cmd = [
        mvn, "-q", "-B", "-f", str(pom), "dependency:copy-dependencies",
        f"-DoutputDirectory={staging}", "-DincludeScope=runtime", *properties,
    ]  # fmt: skip
    result = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise StackError(
            f"fetching {what} from Maven Central failed (mvn exit {result.returncode}):\n"
            + (result.stdout + result.stderr)[-3000:]
        )
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)
    (target / ".complete").write_text(what)
    return target
