"""What the schema registry's formats share in an export: the wire format (magic byte 0, a 4-byte big-endian
schema id, the payload), the columns a decoded value becomes, and ``_corrupt`` (the value's bytes) with
``_error`` (why) for a value that gives none: not framed, a schema id that is not a version of the subject, or
a payload that does not decode. Each format decodes in the executors with Spark's own compiled functions
(``from_avro``, ``from_json``; Protobuf through the compiled module into JSON text first), one branch per
schema id; nothing here runs Python per record."""

from __future__ import annotations

from collections.abc import Callable

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from tiering_core.schema_registry import HEADER_BYTES, MAGIC

NOT_FRAMED = "not in the schema registry's wire format (magic byte 0 and a schema id)"


def schema_id_of(column: str) -> Column:
    """The schema id of a framed value (bytes 2-5, big-endian)."""
    return F.conv(F.hex(F.substring(F.col(column), 2, 4)), 16, 10).cast("long")


def payload_of(column: str) -> Column:
    """The bytes after the framing."""
    return F.expr(f"substring(`{column}`, {HEADER_BYTES + 1})")


def registry_columns(df: DataFrame, column: str, subject: str, ids: list[int], decoded: Column,
                     failed: Callable[[Column], Column], fields: list[str] | None, taken: set[str], *,
                     prefix: str | None, corrupt: str, error_column: str, failure: str = "does not decode",
                     scalar: Callable[[Column], Column] = lambda value: value) -> DataFrame:  # fmt: skip
    """``df`` with ``column`` replaced by the decoded value's ``fields`` as columns (or, without fields, one
    column ``column``: ``scalar`` of the value), then ``corrupt`` and ``error_column``. ``decoded``: the value
    decoded by its schema id (null for an id not in ``ids``); ``failed(value)``: it did not decode, which
    ``_error`` says as ``<failure> with schema id <id>``. Fields are
    named ``prefix + name``; without a prefix, a field named like a column of ``taken``, ``corrupt`` or
    ``error_column`` gets ``<column>_``."""
    raw = F.col(column)
    framed = (F.length(raw) > HEADER_BYTES - 1) & (F.substring(raw, 1, 1) == F.lit(bytes([MAGIC])))
    rest = [c for c in df.columns if c != column]
    # decoded once per row into a column of its own: the checks and the fields below read it
    staged = df.select(*rest, raw.alias("__raw"), schema_id_of(column).alias("__id"), framed.alias("__framed"),
                       schema_id_of(column).isin(ids).alias("__known"), decoded.alias("__value"))  # fmt: skip
    sid, value = F.col("__id").cast("string"), F.col("__value")
    error: Column = (
        F.when(F.col("__raw").isNull(), F.lit(None))
        .when(~F.col("__framed"), F.lit(NOT_FRAMED))
        .when(~F.col("__known"), F.concat(F.lit("schema id "), sid, F.lit(f" is not a version of subject {subject}")))
        .when(failed(value), F.concat(F.lit(f"{failure} with schema id "), sid))
    )  # fmt: skip
    if fields is not None:
        names = {*taken, corrupt, error_column}
        columns = [F.when(error.isNull(), value[name]).alias(_column_name(name, column, prefix, names))
                   for name in fields]  # fmt: skip
    else:
        columns = [F.when(error.isNull(), scalar(value)).alias(column)]
    return staged.select(*rest, *columns, F.when(error.isNotNull(), F.col("__raw")).alias(corrupt),
                         error.cast("string").alias(error_column))  # fmt: skip


def _column_name(field: str, column: str, prefix: str | None, taken: set[str]) -> str:
    if prefix is not None:
        return prefix + field
    return f"{column}_{field}" if field in taken else field
