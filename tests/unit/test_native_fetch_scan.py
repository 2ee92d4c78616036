"""The compiled walks of the proxy (native/src/fetch_scan.rs) against the Python ones they replace, the reference:
a broker's Fetch answer (``tiering_native.fetch_answer_scan`` against ``walk_fetch``: the same partition headers,
top-level error, tagged flag and records' positions) and a client's Fetch request (``fetch_request_layout``
against ``walk_layout``: the same positions), at every version the proxy handles, and the same frames refused,
cut at every byte or with any byte changed."""

from __future__ import annotations

import random

import pytest
from kio.schema.errors import ErrorCode

from reader.proxy import fetch_request, fetch_scan
from reader.proxy.fetch_request import FetchLayout, fetch_layout
from reader.proxy.fetch_scan import ScannedFetch, scan_fetch, walk_fetch
from reader.proxy.protocol import ProtocolError, read_request_head, response_body_start
from tests.fetch_answers import VERSIONS, fetch_answer
from tests.unit.test_proxy_fetch_request import _request

native = pytest.importorskip("tiering_native", reason="the compiled module is not built (bash deploy/setup.sh)")


@pytest.fixture(autouse=True)
def compiled(monkeypatch: pytest.MonkeyPatch) -> None:
    """``scan_fetch`` on the compiled scan, even where TIERING_NATIVE_DECODER=0 turned the module off."""
    monkeypatch.setattr(fetch_scan, "_NATIVE_SCAN", native.fetch_answer_scan)


def _layouts(frame: bytes | bytearray, version: int, start: int) -> tuple[FetchLayout | str, FetchLayout | str]:
    """The request's layout (or "refused") by the compiled walk and by the Python one."""
    out: list[FetchLayout | str] = []
    for walk in (native.fetch_request_layout, None):
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(fetch_request, "_NATIVE_LAYOUT", walk)
            try:
                out.append(fetch_layout(frame, start, version))
            except ProtocolError:
                out.append("refused")
    return out[0], out[1]


def _outcome(scan: object, frame: bytes | memoryview, version: int, start: int) -> tuple[ScannedFetch, list[int]] | str:
    """What ``scan`` gives for the answer (its result and the records' positions), or that it refused it."""
    records_at: list[int] = []
    try:
        return scan(frame, version, start, records_at), records_at  # type: ignore[operator]
    except ProtocolError:
        return "refused"


def _shapes(version: int) -> list[dict[str, object]]:
    shapes: list[dict[str, object]] = [{}, {"diverging": True}, {"error": ErrorCode.offset_out_of_range},
                                       {"record_copies": 64}]  # fmt: skip
    if version >= 7:
        shapes.append({"top_error": ErrorCode.unknown_server_error})
    if version >= 16:
        shapes.append({"endpoints": True})
    return shapes


@pytest.mark.parametrize("version", VERSIONS)
def test_the_compiled_scan_reads_what_the_python_walk_reads(version: int) -> None:
    for shape in _shapes(version):
        frame, expected = fetch_answer(version, **shape)  # type: ignore[arg-type]
        start = response_body_start(frame, 1, version)
        compiled, python = _outcome(scan_fetch, frame, version, start), _outcome(walk_fetch, frame, version, start)
        assert compiled == python, shape
        assert not isinstance(compiled, str) and compiled[0].partitions == expected, shape


@pytest.mark.parametrize("version", (4, 5, 7, 11, 12, 13, 16, 18))
def test_an_answer_cut_at_any_byte_is_refused_by_both(version: int) -> None:
    frame, _ = fetch_answer(version, diverging=version >= 12)
    start = response_body_start(frame, 1, version)
    for end in range(start, len(frame)):
        cut = bytes(frame[:end])
        assert _outcome(scan_fetch, cut, version, start) == _outcome(walk_fetch, cut, version, start) == "refused", end


@pytest.mark.parametrize("version", (4, 7, 11, 12, 13, 16, 18))
def test_an_answer_with_any_byte_changed_gives_the_same_outcome_to_both(version: int) -> None:
    """Lengths, counts, varints, names (UTF-8 broken too): every byte of the headers changed to values that matter
    (0, 1, 0x7F, 0x80, 0xFF and a random one); each side refuses it, or both read the same."""
    frame, _ = fetch_answer(version, diverging=version >= 12, endpoints=version >= 16)
    start = response_body_start(frame, 1, version)
    rng = random.Random(version)
    refused = 0
    for pos in range(start, len(frame)):
        for value in (0, 1, 0x7F, 0x80, 0xFF, rng.randrange(256)):
            changed = bytearray(frame)
            changed[pos] = value
            compiled = _outcome(scan_fetch, changed, version, start)
            assert compiled == _outcome(walk_fetch, changed, version, start), (pos, value)
            refused += compiled == "refused"
    assert refused > 0  # the changes reach the checks


def test_an_answer_that_starts_past_its_end_is_refused() -> None:
    frame, _ = fetch_answer(13)
    past = len(frame) + 1
    assert _outcome(scan_fetch, frame, 13, past) == _outcome(walk_fetch, frame, 13, past) == "refused"
    compiled, python = _layouts(bytes(frame), 13, past)
    assert compiled == python == "refused"


@pytest.mark.parametrize("version", VERSIONS)
def test_the_compiled_request_layout_is_the_python_one(version: int) -> None:
    for forgotten in (False, True):
        frame, _ = _request(version, forgotten)
        start = read_request_head(frame).body
        compiled, python = _layouts(frame, version, start)
        assert compiled == python and not isinstance(compiled, str), forgotten


@pytest.mark.parametrize("version", (4, 7, 9, 12, 13, 15, 18))
def test_a_request_cut_or_changed_anywhere_gives_the_same_outcome_to_both(version: int) -> None:
    frame, _ = _request(version, forgotten=True)
    start = read_request_head(frame).body
    rng = random.Random(version)
    refused = 0
    for end in range(start, len(frame)):
        compiled, python = _layouts(frame[:end], version, start)
        assert compiled == python, end
        refused += compiled == "refused"
    for pos in range(start, len(frame)):
        for value in (0, 1, 0x7F, 0x80, 0xFF, rng.randrange(256)):
            changed = bytearray(frame)
            changed[pos] = value
            compiled, python = _layouts(changed, version, start)
            assert compiled == python, (pos, value)
    assert refused > 0
