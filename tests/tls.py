"""A self-signed certificate for 127.0.0.1, made with the openssl command line, for TLS tests."""

from __future__ import annotations

import subprocess
from pathlib import Path


def self_signed(directory: Path, name: str = "server") -> tuple[Path, Path]:
    """(certificate, private key) PEM files in ``directory``, valid for IP 127.0.0.1 for two days."""
    cert, key = directory / f"{name}.pem", directory / f"{name}.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out",
                    str(cert), "-days", "2", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True)  # fmt: skip
    return cert, key
