"""PostgreSQL from Debian's ``postgresql`` package, one local server: the database of an Iceberg SQL catalog as
production runs it (the tests of ``tiering export --format iceberg``). Listens on 127.0.0.1 only, trusts local
connections, no fsync (a test's data). The server refuses to run as root, so a root caller runs it as the
package's ``postgres`` user, in a directory that user owns."""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from deploy.errors import StackError

USER = "tiering"


def postgres_bin_dir() -> Path:
    """The newest installed server's ``bin`` (``/usr/lib/postgresql/<major>/bin``)."""
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/postgres"), key=lambda p: int(p.parent.parent.name))
    if not found:
        raise StackError("PostgreSQL not found: install Debian's postgresql package (apt-get install postgresql)")
    return found[-1].parent


@dataclass(frozen=True)
class Postgres:
    port: int
    directory: Path

    @property
    def uri(self) -> str:
        """SQLAlchemy's URI of the server's ``postgres`` database (psycopg2)."""
        return f"postgresql+psycopg2://{USER}@127.0.0.1:{self.port}/postgres"

    def stop(self) -> None:
        _run([str(postgres_bin_dir() / "pg_ctl"), "-D", str(self.directory / "data"), "-m", "fast", "-w", "stop"])
        shutil.rmtree(self.directory, ignore_errors=True)


def start_postgres(directory: Path, port: int) -> Postgres:
    """A new server with its data in ``directory`` (created; readable by the server's user: not under a
    root-only directory), listening on ``port``. Raises StackError naming its log when it does not start."""
    bin_dir = postgres_bin_dir()
    directory.mkdir(parents=True, exist_ok=True)
    if os.geteuid() == 0:
        shutil.chown(directory, "postgres", "postgres")
    data, log = directory / "data", directory / "postgres.log"
    _run([str(bin_dir / "initdb"), "-D", str(data), "-U", USER, "-A", "trust", "-E", "UTF8", "--no-sync"])
    options = f"-p {port} -c listen_addresses=127.0.0.1 -k {directory} -c fsync=off -c full_page_writes=off"
    try:
        _run([str(bin_dir / "pg_ctl"), "-D", str(data), "-l", str(log), "-o", options, "-w", "-t", "60", "start"])
    except StackError as exc:
        tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
        raise StackError(f"{exc}\n{log}:\n{tail}") from exc
    return Postgres(port, directory)


def _run(argv: list[str]) -> None:
    if os.geteuid() == 0:
        argv = ["runuser", "-u", "postgres", "--", *argv]
    result = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=120)
    if result.returncode != 0:
        raise StackError(f"{' '.join(argv)} exited {result.returncode}: {(result.stdout + result.stderr)[-2000:]}")
