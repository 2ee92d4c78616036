"""MinIO, the S3-compatible server of the local stack, built from source with ``go install``.

Why MinIO: its ranged GETs read only the requested range (moto's server reads the whole object per
ranged GET, which distorts catch-up read benchmarks), and it implements multipart uploads and
checksums as S3 does. The module version is pinned; the binary is built once into the cache.
"""

from __future__ import annotations

import os
import shutil
import ssl
import subprocess
import urllib.request
from pathlib import Path

from deploy.endpoints import S3Endpoint
from deploy.errors import StackError
from deploy.procs import spawn
from tiering_core.cache import cache_dir

MINIO_MODULE = "github.com/minio/minio"
MINIO_VERSION = "v0.0.0-20260212201848-7aac2a2c5b7c"
BUCKET = "tiering"
ACCESS_KEY = "tiering"
SECRET_KEY = "tiering-secret-key"
REGION = "us-east-1"


def minio_binary() -> Path:
    return cache_dir() / f"minio-{MINIO_VERSION}" / "minio"


def build_minio() -> Path:
    """Build MinIO with ``go install`` into the cache once (several minutes the first time)."""
    binary = minio_binary()
    if binary.exists():
        return binary
    go = shutil.which("go") or ("/usr/local/go/bin/go" if Path("/usr/local/go/bin/go").exists() else None)
    if go is None:
        raise StackError("go not found on PATH: install Go 1.24+ to build MinIO for the local stack")
    env = {**os.environ, "GOBIN": str(binary.parent), "CGO_ENABLED": "0"}
    result = subprocess.run(
        [go, "install", f"{MINIO_MODULE}@{MINIO_VERSION}"],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    if result.returncode != 0 or not binary.exists():
        raise StackError(f"building MinIO ({MINIO_MODULE}@{MINIO_VERSION}) failed:\n{result.stderr[-3000:]}")
    return binary


def start_minio(data_dir: Path, port: int, console_port: int, certs_dir: Path | None = None) -> int:
    """Start MinIO on 127.0.0.1:``port``; with ``certs_dir`` (holding ``public.crt`` and ``private.key``) it
    serves https only."""
    data_dir.mkdir(parents=True, exist_ok=True)
    env = {
        "MINIO_ROOT_USER": ACCESS_KEY,
        "MINIO_ROOT_PASSWORD": SECRET_KEY,
        "MINIO_BROWSER": "off",
        "MINIO_UPDATE": "off",
        "MINIO_REGION": REGION,
    }
    argv = [
        str(build_minio()), "server", str(data_dir / "data"), "--quiet",
        "--address", f"127.0.0.1:{port}", "--console-address", f"127.0.0.1:{console_port}",
    ]  # fmt: skip
    if certs_dir is not None:
        argv += ["--certs-dir", str(certs_dir)]
    return spawn(argv, data_dir / "minio.log", env=env)


def minio_live(port: int, ca_file: Path | None = None) -> bool:
    """Whether MinIO answers its liveness probe; over https, verified against ``ca_file``, when given."""
    scheme, context = ("https", ssl.create_default_context(cafile=str(ca_file))) if ca_file else ("http", None)
    with urllib.request.urlopen(f"{scheme}://127.0.0.1:{port}/minio/health/live", timeout=2, context=context) as resp:
        return bool(resp.status == 200)


def s3_endpoint(port: int, data_dir: Path, pid: int | None = None) -> S3Endpoint:
    """The stack's S3 endpoint: MinIO on 127.0.0.1:``port``, with the stack's keys, region and bucket."""
    return S3Endpoint(
        endpoint_url=f"http://127.0.0.1:{port}",
        access_key=ACCESS_KEY,
        secret_key=SECRET_KEY,
        region=REGION,
        bucket=BUCKET,
        data_dir=str(data_dir),
        pid=pid,
    )
