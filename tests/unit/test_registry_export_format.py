"""How an export decodes a subject's values (tiering_core/schema_registry.py ``export_format``): the format asked
for, or with ``auto`` the subject's schema type; anything it cannot decode is one sentence before Spark starts."""

from __future__ import annotations

import pytest

from tiering_core.errors import ConfigError
from tiering_core.schema_registry import RegisteredSchema, export_format


def versions(*types: str) -> list[RegisteredSchema]:
    return [RegisteredSchema(i + 1, "orders-value", i + 1, t, "{}") for i, t in enumerate(types)]


@pytest.mark.parametrize(("types", "chosen"), [(("AVRO", "AVRO"), "avro"), (("JSON",), "json-schema"),
                                               (("PROTOBUF",), "protobuf")])  # fmt: skip
def test_auto_takes_the_subjects_schema_type(types: tuple[str, ...], chosen: str) -> None:
    assert export_format("orders-value", versions(*types), "auto") == chosen
    assert export_format("orders-value", versions(*types), chosen) == chosen


def test_a_format_the_subject_has_no_schema_of_names_what_it_has() -> None:
    with pytest.raises(ConfigError, match=r"subject orders-value has no avro schema in the registry \(its versions: "
                       r"json-schema\)"):  # fmt: skip
        export_format("orders-value", versions("JSON"), "avro")


def test_auto_over_mixed_types_asks_for_one() -> None:
    with pytest.raises(ConfigError, match=r"several schema types \(avro, json-schema\)"):
        export_format("orders-value", versions("AVRO", "JSON"), "auto")
    assert export_format("orders-value", versions("AVRO", "JSON"), "avro") == "avro"
