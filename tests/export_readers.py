"""Exported tables read back by readers independent of Spark: deltalake (Delta tables), pyarrow.parquet and
DuckDB (the Parquet files of a Parquet export, or the current files of a Delta table). Every column asked
for is decoded into Python objects, so a string column holding invalid UTF-8 fails here as it would for any
user; the readers must agree row for row."""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import DeltaTable


def data_files(path: str, fmt: str) -> list[str]:
    """The Parquet files holding the table now: a Delta table's current files (its log), or a Parquet
    export's committed ones (``partition=P/date=D/``; ``_`` paths are staging and markers)."""
    if fmt == "delta":
        return [uri.removeprefix("file://") for uri in DeltaTable(path).file_uris()]
    return sorted(str(f) for f in Path(path).glob("partition=*/date=*/*.parquet"))


def read_tables(path: str, fmt: str, columns: list[str]) -> dict[str, pa.Table]:
    """``columns`` of the table at ``path`` as each independent reader reads them."""
    files = data_files(path, fmt)
    assert files, f"no data files in {path}"
    tables = {
        "pyarrow.parquet": pq.ParquetDataset(files, partitioning=None).read(columns=columns),
        "duckdb": duckdb.read_parquet(files).select(*columns).to_arrow_table(),
    }
    if fmt == "delta":
        tables["deltalake"] = DeltaTable(path).to_pyarrow_table(columns=columns)
    return tables


def exported_rows(path: str, fmt: str, columns: list[str]) -> list[dict[str, Any]]:
    """The rows (``columns``, which include ``offset``; one partition) of an exported table, by offset, as
    every independent reader reads them; fails naming a reader that reads them differently."""
    assert "offset" in columns
    readings = {
        name: sorted(([{k: _utc(v) for k, v in row.items()} for row in t.to_pylist()]), key=lambda r: r["offset"])
        for name, t in read_tables(path, fmt, columns).items()
    }
    (first, rows), *others = readings.items()
    for name, other in others:
        assert other == rows, f"{name} and {first} read {path} differently"
    return rows


def _utc(value: Any) -> Any:
    """A timestamp as its UTC instant without a zone: the files hold UTC instants (Parquet's INT64 microseconds
    adjusted to UTC), which pyarrow, DuckDB and deltalake read with a zone; the instants agree."""
    if isinstance(value, datetime.datetime) and value.tzinfo is not None:
        return value.astimezone(datetime.UTC).replace(tzinfo=None)
    return value
