"""Iceberg tables from the remote copies (issue 28, part 2, first step): a SQL catalog (sqlite) with a
filesystem warehouse; Spark writes the files, pyiceberg commits them. Read back with pyiceberg (to Arrow) and
with DuckDB over the files the table lists: every committed offset exactly once, equal to what was produced."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import duckdb
import pytest
from pyiceberg.catalog import load_catalog
from pyspark.sql import SparkSession

from deploy.stack import Endpoints
from reader.spark.export import ExportRequest, run_export
from tests.integration.test_spark_export import (  # noqa: F401  (the module's fixtures)
    Tiered,
    digest,
    produce_json_filler,
    spark,
    tier_everything_rolled,
    tiered,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def catalog_properties(tmp: Path) -> dict[str, str]:
    return {"type": "sql", "uri": f"sqlite:///{tmp}/catalog.db", "warehouse": f"file://{tmp}/warehouse"}


def table_digests(props: dict[str, str], identifier: str) -> tuple[dict[int, str], dict[int, str], Any]:
    """The rows' digests as pyiceberg reads the table and as DuckDB reads the files it lists (each offset once)."""
    table = load_catalog("test", **props).load_table(identifier)
    rows = table.scan(selected_fields=("offset", "key", "value", "headers")).to_arrow().to_pylist()
    files = [task.file.file_path.removeprefix("file://") for task in table.scan().plan_files()]
    duck = duckdb.read_parquet(files).select("offset", "key", "value", "headers").to_arrow_table().to_pylist()
    out = []
    for read in (rows, duck):
        digests = {r["offset"]: digest(r["offset"], r["key"], r["value"],
                                       [(h["key"], h["value"]) for h in r["headers"]]) for r in read}  # fmt: skip
        assert len(digests) == len(read), "an offset is in the table twice"
        out.append(digests)
    return out[0], out[1], table


def test_iceberg_export_then_incremental_runs_hold_every_offset_once(
    tiered: Tiered,  # noqa: F811
    spark: SparkSession,  # noqa: F811
    tmp_path: Path,
    stack: Endpoints,
) -> None:
    props = catalog_properties(tmp_path)
    identifier = "lake.orders"

    def export(incremental: bool) -> Any:
        return run_export(spark, ExportRequest(topic=tiered.topic, format="iceberg", path=identifier,
                                               store=tiered.settings.remote_storage, incremental=incremental,
                                               catalog="test", catalog_properties=props))  # fmt: skip

    first = export(False)
    (rng,) = first.ranges
    pyiceberg_rows, duckdb_rows, table = table_digests(props, identifier)
    assert pyiceberg_rows == duckdb_rows == tiered.committed(rng.last)
    assert first.rows == len(pyiceberg_rows)
    spec = [(f.name, str(f.transform)) for f in table.spec().fields]
    assert spec == [("partition", "identity"), ("timestamp_day", "day")]

    for seed in (100_000, 200_000):  # produce more, tier it, export incrementally
        produce_json_filler(stack.bootstrap, tiered.topic, 2_000, seed, tiered.produced)
        tier_everything_rolled(tiered.config, tiered.topic)
        again = export(True)
        (rng,) = again.ranges
        assert again.committed and rng.first > first.ranges[0].first
    pyiceberg_rows, duckdb_rows, table = table_digests(props, identifier)
    assert pyiceberg_rows == duckdb_rows == tiered.committed(rng.last), "an offset is missing, extra or different"
    assert len(table.snapshots()) >= 3
    assert export(True).committed is False, "a run with nothing new committed something"


def test_a_run_killed_before_its_commit_adds_nothing_and_the_next_run_continues(
    tiered: Tiered,  # noqa: F811
    spark: SparkSession,  # noqa: F811
    tmp_path: Path,
) -> None:
    props = catalog_properties(tmp_path)
    identifier = "lake.killed"
    env = {**os.environ, "TIERING_CRASH_AT": "export.files_written:1",
           **{f"PYICEBERG_CATALOG__TEST__{k.upper()}": v for k, v in props.items()}}  # fmt: skip
    run = subprocess.run(
        [sys.executable, "-m", "tiering", "export", tiered.topic, "--format", "iceberg", "--catalog", "test",
         "--path", identifier, "--incremental", "--master", "local[2]", "--config", str(tiered.config)],
        capture_output=True, text=True, timeout=600, env=env,
    )  # fmt: skip
    assert run.returncode == -9, run.stderr[-3000:]
    table = load_catalog("test", **props).load_table(identifier)
    assert table.current_snapshot() is None, "the killed run committed"
    written = list(Path(tmp_path, "warehouse").rglob("*.parquet"))
    assert written, "the run was killed before it wrote anything: the test proved nothing"
    result = run_export(spark, ExportRequest(topic=tiered.topic, format="iceberg", path=identifier,
                                             store=tiered.settings.remote_storage, incremental=True,
                                             catalog="test", catalog_properties=props))  # fmt: skip
    (rng,) = result.ranges
    pyiceberg_rows, duckdb_rows, _ = table_digests(props, identifier)
    assert pyiceberg_rows == duckdb_rows == tiered.committed(rng.last, rng.first)
    assert not any(p.exists() for p in written), "the killed run's files were left behind"
