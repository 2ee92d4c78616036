"""The container engine of the containers backend: podman from Debian, as root, with runc.

Two ways in, both configured here: the ``podman`` command (image builds) and podman's
Docker-compatible API on a unix socket (``podman system service``), which testcontainers drives.

- crun fails on this kind of machine (rlimits, cgroups v1); runc works once containers get no default
  ulimits. That goes in a ``containers.conf`` of our own, given through ``CONTAINERS_CONF``, so nothing
  under /etc changes. A ``CONTAINERS_CONF`` already set in the environment is respected.
- ``DOCKER_HOST`` set by the user names their engine's socket: it is used, and must answer. Unset, a
  service of our own is started on ``<cache>/podman/podman.sock`` (and reused while it answers).
- testcontainers reads its settings from the environment when it is imported: Ryuk (its reaper
  container, an image we cannot pull) off, ports published and reached on 127.0.0.1.

Every check has a timeout: a missing podman or a dead socket is a StackError saying what to do,
never a hang.
"""

from __future__ import annotations

import http.client
import os
import shutil
import socket
import subprocess
import urllib.parse
from pathlib import Path

from deploy.errors import StackError
from deploy.procs import alive, spawn, stop_groups, wait_ready
from tiering_core.cache import cache_dir

CONTAINERS_CONF = """\
# Written by deploy/podman.py for the containers backend (given to podman through CONTAINERS_CONF).
[containers]
default_ulimits = []

[engine]
runtime = "runc"
"""
TESTCONTAINERS_ENV = {
    "TESTCONTAINERS_RYUK_DISABLED": "true",
    "TESTCONTAINERS_HOST_OVERRIDE": "127.0.0.1",
    "TESTCONTAINERS_CONNECTION_MODE": "docker_host",
}
IDLE_SECONDS = 600
INSTALL_HINT = "install podman and runc from Debian (apt-get install podman runc; deploy/setup.sh does it)"


def podman_dir() -> Path:
    path = cache_dir() / "podman"
    path.mkdir(parents=True, exist_ok=True)
    return path


def podman_binary() -> str:
    podman = shutil.which("podman")
    if podman is None:
        raise StackError(f"podman not found on PATH: the containers backend needs it; {INSTALL_HINT}")
    return podman


def engine_env() -> dict[str, str]:
    """The environment for podman commands: ``CONTAINERS_CONF`` (ours unless one is set)."""
    conf = os.environ.get("CONTAINERS_CONF")
    if not conf:
        path = podman_dir() / "containers.conf"
        if not path.exists() or path.read_text() != CONTAINERS_CONF:
            path.write_text(CONTAINERS_CONF)
        conf = str(path)
    return {**os.environ, "CONTAINERS_CONF": conf}


def run(*args: str, timeout: float = 120, what: str = "") -> str:
    """Run ``podman ARGS`` and return its stdout; StackError with its output on failure or timeout."""
    cmd = [podman_binary(), *args]
    try:
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=engine_env(), check=False)
    except subprocess.TimeoutExpired as exc:
        raise StackError(f"{what or ' '.join(cmd)}: podman did not finish within {timeout:.0f}s") from exc
    if result.returncode != 0:
        raise StackError(
            f"{what or ' '.join(cmd)} failed (podman exit {result.returncode}):\n"
            + (result.stdout + result.stderr)[-3000:]
        )
    return result.stdout


class _UnixConnection(http.client.HTTPConnection):
    """HTTP over a unix socket, with a timeout on connect and on every read."""

    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self.path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        sock.connect(self.path)
        self.sock = sock


def answers(docker_host: str, timeout: float = 5.0) -> bool:
    """True when the Docker-compatible API at ``docker_host`` (``unix:///path``) answers ``/_ping``."""
    url = urllib.parse.urlparse(docker_host)
    if url.scheme != "unix":
        raise StackError(f"DOCKER_HOST={docker_host}: the containers backend takes a unix:// socket")
    conn = _UnixConnection(url.path, timeout)
    try:
        conn.request("GET", "/_ping")
        return conn.getresponse().status == 200
    except OSError:
        return False
    finally:
        conn.close()


def ensure_service(timeout: float = 60.0) -> str:
    """Make sure a Docker-compatible API answers; set the environment testcontainers reads; return its URL.

    Idempotent. Raises StackError when podman is missing, the user's ``DOCKER_HOST`` does not answer, or
    our own service does not come up within ``timeout`` (with the tail of its log).
    """
    user_host = os.environ.get("DOCKER_HOST")
    if user_host:
        if not answers(user_host):
            raise StackError(
                f"DOCKER_HOST={user_host} does not answer: start the engine there (podman system service "
                f"--time=0 {user_host} &) or unset DOCKER_HOST to let the stack start its own"
            )
        host = user_host
    else:
        podman_binary()
        sock = podman_dir() / "podman.sock"
        host = f"unix://{sock}"
        if not answers(host):
            _start_service(sock, host, timeout)
    os.environ["DOCKER_HOST"] = host
    for key, value in TESTCONTAINERS_ENV.items():
        os.environ.setdefault(key, value)
    return host


def _start_service(sock: Path, host: str, timeout: float) -> None:
    stop_service()
    sock.unlink(missing_ok=True)
    log = podman_dir() / "service.log"
    env = {"CONTAINERS_CONF": engine_env()["CONTAINERS_CONF"]}
    # It exits after IDLE_SECONDS without API calls (nothing is left running after a test run or CI);
    # the next call starts it again.
    pid = spawn([podman_binary(), "system", "service", f"--time={IDLE_SECONDS}", host], log, env=env)
    (podman_dir() / "service.pid").write_text(str(pid))
    wait_ready("podman system service", pid, lambda: answers(host), log, timeout=timeout)


def stop_service() -> None:
    """Stop the API service this module started (not a user's ``DOCKER_HOST``); idempotent."""
    pid_file = podman_dir() / "service.pid"
    if pid_file.exists():
        pid = int(pid_file.read_text() or 0)
        if alive(pid):
            stop_groups([pid], timeout=10)
        pid_file.unlink(missing_ok=True)
