"""What the export tests of the registry's formats share: the values produced, by offset, and the check that
each exported row holds what its value gave (its fields, or its bytes in ``_corrupt`` with the reason)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any


class FramedValues:
    def __init__(self, topic: str, config: Path) -> None:
        self.topic, self.config = topic, config
        self.values: dict[int, bytes | None] = {}
        self.expected: dict[int, Any] = {}  # offset -> what the value holds; None: a value that gives none
        self.errors: dict[int, str | None] = {}


def check_decoded(rows: dict[int, dict[str, Any]], produced: FramedValues, fields: list[str], last: int,
                  expected_row: Callable[[Any], dict[str, Any] | None],
                  normalize: Callable[[dict[str, Any]], dict[str, Any]]) -> set[int]:  # fmt: skip
    """Every offset up to ``last`` exported once; a value's fields (``normalize``d as its reader gives them) equal
    to ``expected_row`` of what was produced; a null value null fields; a value that gives none null fields,
    its bytes in ``_corrupt`` and its reason in ``_error``. Returns the offsets of those."""
    assert sorted(rows) == [o for o in sorted(produced.values) if o <= last], "an offset is missing or extra"
    for offset, row in rows.items():
        want = expected_row(produced.expected[offset])
        got = {f: row[f] for f in fields}
        if want is not None:
            assert normalize(got) == want, f"offset {offset}: {got} != {want}"
            assert row["_corrupt"] is None and row["_error"] is None, offset
        elif produced.values[offset] is None:  # a null value: null fields, nothing corrupt
            assert all(v is None for v in got.values()) and row["_error"] is None, offset
        else:
            assert all(v is None for v in got.values()), f"offset {offset}: fields from a value that gives none"
            assert row["_error"] == produced.errors[offset], offset
            assert row["_corrupt"] == produced.values[offset], f"offset {offset}: its bytes are not kept"
    errors = {o for o, e in produced.errors.items() if e is not None and o <= last}
    assert {o for o, r in rows.items() if r["_error"] is not None} == errors
    return errors
