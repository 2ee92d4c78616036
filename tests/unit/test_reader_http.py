"""The HTTP service's pure parts: settings and their bounds, bearer tokens, records as JSON."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest
from pydantic import SecretStr

from reader.http.auth import BearerAuth
from reader.http.config import HttpSettings, load_service_settings
from reader.http.records import NotUtf8, page_records
from reader.http.service import Page
from tests.kafka_encoder import encode_batch
from tiering_core.errors import ConfigError
from tiering_core.formats import scan_headers


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "reader.yaml"
    path.write_text(text)
    return path


def test_settings_refuse_a_service_without_tokens(tmp_path: Path) -> None:
    path = write(tmp_path, "bootstrap_servers: localhost:9092\n")
    with pytest.raises(ConfigError, match="no bearer token configured") as failed:
        load_service_settings(path)
    assert str(path) in str(failed.value)
    open_service = write(tmp_path, "bootstrap_servers: b:9092\nhttp: {allow_unauthenticated: true}\n")
    assert load_service_settings(open_service).http.tokens == []


def test_tokens_come_from_the_environment_and_stay_secret(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TIERING_HTTP__TOKENS", '["alpha", "beta"]')
    settings = load_service_settings(write(tmp_path, "bootstrap_servers: b:9092\nhttp: {port: 9000}\n"))
    assert [t.get_secret_value() for t in settings.http.tokens] == ["alpha", "beta"]
    assert settings.http.port == 9000 and settings.http.host == "127.0.0.1"
    assert "alpha" not in repr(settings) and "alpha" not in str(settings.model_dump())


@pytest.mark.parametrize(
    ("http", "message"),
    [
        ("{tokens: [t], default_fetch_bytes: 2000000, max_fetch_bytes: 1000000}", "exceeds max_fetch_bytes"),
        ("{tokens: [t], default_records: 20, max_records: 10}", "exceeds max_records"),
        ("{tokens: ['']}", "empty token"),
        ("{tokens: [t], max_fetch_bytes: 200000000}", "at least two requests"),
    ],
)
def test_settings_bounds_are_checked(tmp_path: Path, http: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_service_settings(write(tmp_path, f"bootstrap_servers: b:9092\nhttp: {http}\n"))


def test_bearer_auth_accepts_only_configured_tokens() -> None:
    auth = BearerAuth([SecretStr("first-token"), SecretStr("second")])
    assert auth.accepts("first-token") and auth.accepts("second")
    for wrong in ("", "first", "first-token ", "second-token", "FIRST-TOKEN"):
        assert not auth.accepts(wrong), wrong


def records(n: int, prefix: str) -> list[tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]]]]:
    return [(None if i == 0 else f"{prefix}k{i}".encode(), f"{prefix}v{i}".encode(), [("h", None), ("h", b"x")])
            for i in range(n)]  # fmt: skip


def page(*batches: bytes, offset: int, next_offset: int) -> Page:
    data = b"".join(batches)
    return Page("t", 0, offset, data, list(scan_headers("test", data)), next_offset, 0, 99, None, "p/t/0/x.log")


CONTROL = encode_batch(10, [(b"\x00\x00\x00\x01", b"\x00\x00\x00\x00\x00\x05", [])], attributes_extra=0x30,
                       producer_id=7)  # fmt: skip


def test_json_records_start_at_the_offset_skip_control_batches_and_say_where_to_continue() -> None:
    first = encode_batch(0, records(5, "a"), leader_epoch=3)
    second = encode_batch(5, records(5, "b"), codec=4, leader_epoch=-1, attributes_extra=0x08)
    third = encode_batch(11, records(3, "c"), codec=2)
    p = page(first, second, CONTROL, third, offset=2, next_offset=14)
    out, next_offset = page_records(p, "base64", 100, 1 << 20)
    assert [r["offset"] for r in out] == [2, 3, 4, 5, 6, 7, 8, 9, 11, 12, 13] and next_offset == 14
    r = out[0]
    assert base64.b64decode(r["key"]) == b"ak2" and base64.b64decode(r["value"]) == b"av2"
    assert r["headers"] == [{"key": "h", "value": None}, {"key": "h", "value": base64.b64encode(b"x").decode()}]
    assert r["leader_epoch"] == 3 and r["timestamp_type"] == "CreateTime" and r["timestamp"] == 1_700_000_000_002
    later = out[3]
    assert later["offset"] == 5 and later["key"] is None and later["leader_epoch"] is None
    assert later["timestamp_type"] == "LogAppendTime" and later["timestamp"] == 1_700_000_000_004  # max timestamp

    out, next_offset = page_records(p, "utf-8", 4, 1 << 20)
    assert [r["offset"] for r in out] == [2, 3, 4, 5] and next_offset == 6
    assert out[0]["key"] == "ak2" and out[0]["headers"][1] == {"key": "h", "value": "x"}
    out, next_offset = page_records(p, "utf-8", 100, 1)
    assert [r["offset"] for r in out] == [2] and next_offset == 3, "max_bytes bounds a page, one record at least"


def test_utf8_encoding_of_binary_data_names_the_offset() -> None:
    binary = encode_batch(40, [(b"ok", b"\xff\xfe", [])])
    with pytest.raises(NotUtf8, match="value of the record at offset 40 is not valid UTF-8; ask with encoding=base64"):
        page_records(page(binary, offset=40, next_offset=41), "utf-8", 10, 1000)
    out, _ = page_records(page(binary, offset=40, next_offset=41), "base64", 10, 1000)
    assert base64.b64decode(out[0]["value"]) == b"\xff\xfe"


def test_http_settings_default_to_loopback_and_bounded_requests() -> None:
    http = HttpSettings(tokens=[SecretStr("t")])
    assert http.host == "127.0.0.1"
    assert http.default_fetch_bytes <= http.max_fetch_bytes and http.default_records <= http.max_records
