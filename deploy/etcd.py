"""etcd from Debian's ``etcd-server`` package, as a single local member."""

from __future__ import annotations

import json
import shutil
import urllib.request
from pathlib import Path

from deploy.errors import StackError
from deploy.procs import spawn


def etcd_binary() -> str:
    path = shutil.which("etcd") or ("/usr/bin/etcd" if Path("/usr/bin/etcd").exists() else None)
    if path is None:
        raise StackError("etcd not found: install Debian's etcd-server package (apt-get install etcd-server)")
    return path


def start_etcd(etcd_dir: Path, client_port: int, peer_port: int) -> int:
    etcd_dir.mkdir(parents=True, exist_ok=True)
    peer = f"http://127.0.0.1:{peer_port}"
    client = f"http://127.0.0.1:{client_port}"
    argv = [
        etcd_binary(), "--name", "local", "--data-dir", str(etcd_dir / "data"),
        "--listen-client-urls", client, "--advertise-client-urls", client,
        "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
        "--initial-cluster", f"local={peer}", "--initial-cluster-state", "new",
        "--log-level", "warn", "--logger", "zap",
    ]  # fmt: skip
    return spawn(argv, etcd_dir / "etcd.log", env={"ETCD_UNSUPPORTED_ARCH": "", "ETCD_LOG_OUTPUTS": "stderr"})


def etcd_healthy(client_port: int) -> bool:
    with urllib.request.urlopen(f"http://127.0.0.1:{client_port}/health", timeout=2) as resp:
        return bool(json.load(resp).get("health") in ("true", True))
