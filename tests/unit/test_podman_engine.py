"""The containers backend fails fast and clearly when its engine is missing: no podman, or a socket that
does not answer, is a StackError naming what to do, within seconds (never a hang)."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest

from deploy import podman
from deploy.errors import StackError


def test_missing_podman_is_a_clear_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("DOCKER_HOST", raising=False)
    monkeypatch.setenv("TIERING_CACHE_DIR", str(tmp_path / "cache"))
    with pytest.raises(StackError, match=r"podman not found on PATH.*apt-get install podman runc"):
        podman.ensure_service()


def test_docker_host_without_a_server_is_a_clear_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/absent.sock")
    with pytest.raises(StackError, match=r"DOCKER_HOST=unix://.*absent\.sock does not answer"):
        podman.ensure_service()


def test_a_socket_that_never_answers_times_out(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    path = tmp_path / "mute.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
        server.bind(str(path))
        server.listen(1)  # accepts the connection, never answers
        monkeypatch.setenv("DOCKER_HOST", f"unix://{path}")
        started = time.monotonic()
        with pytest.raises(StackError, match="does not answer"):
            podman.ensure_service()
        assert time.monotonic() - started < 30, "the check hung instead of timing out"


def test_our_containers_conf_selects_runc_without_default_ulimits(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("CONTAINERS_CONF", raising=False)
    monkeypatch.setenv("TIERING_CACHE_DIR", str(tmp_path))
    conf = Path(podman.engine_env()["CONTAINERS_CONF"])
    assert conf.parent == tmp_path / "podman"
    text = conf.read_text()
    assert 'runtime = "runc"' in text and "default_ulimits = []" in text
    monkeypatch.setenv("CONTAINERS_CONF", "/etc/theirs.conf")
    assert podman.engine_env()["CONTAINERS_CONF"] == "/etc/theirs.conf"
