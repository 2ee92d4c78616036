"""Iceberg tables from the remote copies (issue 28, part 2): a SQL catalog on sqlite with a warehouse on the
filesystem, as production runs it, a SQL catalog on PostgreSQL with a warehouse on S3 (the stack's MinIO), and a
REST catalog (Iceberg's own REST server) with its warehouse on S3; Spark writes the files, pyiceberg commits them.
Read back with pyiceberg (to Arrow) and with DuckDB over the files the table lists: every committed offset exactly
once, equal to what was produced."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import pytest
from pyarrow import fs as pafs
from pyiceberg.catalog import load_catalog
from pyiceberg.io.pyarrow import PyArrowFileIO
from pyspark.sql import SparkSession

from deploy.errors import StackError
from deploy.iceberg_rest import start_rest_catalog
from deploy.postgres import Postgres, start_postgres
from deploy.procs import free_port
from deploy.stack import Endpoints
from reader.spark.export import ExportRequest, run_export
from tests.conftest import unavailable
from tests.integration.test_spark_export import (  # noqa: F401  (the module's fixtures)
    Tiered,
    digest,
    header_pairs,
    produce_json_filler,
    spark,
    tier_everything_rolled,
    tiered,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def catalog_properties(tmp: Path) -> dict[str, str]:
    return {"type": "sql", "uri": f"sqlite:///{tmp}/catalog.db", "warehouse": f"file://{tmp}/warehouse"}


@pytest.fixture(scope="module")
def postgres() -> Iterator[Postgres]:
    try:
        server = start_postgres(Path(tempfile.mkdtemp(prefix="tiering-pg-")), free_port())
    except StackError as exc:
        unavailable("PostgreSQL", exc)
    yield server
    server.stop()


def s3_properties(stack: Endpoints) -> dict[str, str]:
    """The stack's S3 (MinIO) as pyiceberg names its settings (Iceberg's S3FileIO reads the same names)."""
    s3 = stack.s3
    return {"s3.endpoint": s3.endpoint_url, "s3.access-key-id": s3.access_key, "s3.secret-access-key": s3.secret_key,
            "s3.region": s3.region, "s3.path-style-access": "true"}  # fmt: skip


def s3_warehouse(stack: Endpoints) -> str:
    """A new prefix of the stack's bucket."""
    return f"s3://{stack.s3.bucket}/iceberg-{uuid.uuid4().hex[:8]}"


def s3_catalog_properties(stack: Endpoints, postgres: Postgres) -> dict[str, str]:
    """A catalog on PostgreSQL whose warehouse is a new prefix of the stack's bucket."""
    return {"type": "sql", "uri": postgres.uri, "warehouse": s3_warehouse(stack), **s3_properties(stack)}


@pytest.fixture
def rest_catalog(stack: Endpoints) -> Iterator[dict[str, str]]:
    """A REST catalog server of the test's own (a new warehouse, as the other catalogs have: a test lists the files
    under it) on a new prefix of the stack's bucket, written by the server through Iceberg's S3FileIO; the
    properties pyiceberg reaches it with."""
    warehouse = s3_warehouse(stack)
    s3 = s3_properties(stack)
    backend = {"io-impl": "org.apache.iceberg.aws.s3.S3FileIO", "client.region": stack.s3.region, **s3}
    directory = Path(tempfile.mkdtemp(prefix="tiering-iceberg-rest-"))
    try:
        server = start_rest_catalog(directory, free_port(), warehouse, backend)
    except StackError as exc:
        unavailable("the Iceberg REST catalog", exc)
    yield {"type": "rest", "uri": server.uri, "warehouse": warehouse, **s3}
    server.stop()


def local_copies(table: Any, tmp: Path) -> list[str]:
    """The files the table lists, as local paths (those on S3 downloaded through the table's own FileIO)."""
    out = []
    for i, task in enumerate(table.scan().plan_files()):
        path = task.file.file_path
        if path.startswith("file://") or "://" not in path:
            out.append(path.removeprefix("file://"))
            continue
        local = tmp / f"file-{i}.parquet"
        with table.io.new_input(path).open() as src:
            local.write_bytes(src.read())
        out.append(str(local))
    return out


@pytest.fixture(params=["filesystem", "s3", "rest"])
def props(request: pytest.FixtureRequest, tmp_path: Path, stack: Endpoints) -> dict[str, str]:
    """The catalog each test runs with: sqlite with a directory as the warehouse, as production runs it,
    PostgreSQL with the warehouse on S3 (MinIO), and a REST catalog with the warehouse on S3."""
    if request.param == "filesystem":
        return catalog_properties(tmp_path)
    if request.param == "rest":
        return dict(request.getfixturevalue("rest_catalog"))
    return s3_catalog_properties(stack, request.getfixturevalue("postgres"))


def table_digests(props: dict[str, str], identifier: str) -> tuple[dict[int, str], dict[int, str], Any]:
    """The rows' digests as pyiceberg reads the table and as DuckDB reads the files it lists (each offset once)."""
    table = load_catalog("test", **props).load_table(identifier)
    rows = table.scan(selected_fields=("offset", "key", "value", "headers")).to_arrow().to_pylist()
    with tempfile.TemporaryDirectory() as downloads:
        files = local_copies(table, Path(downloads))
        duck = duckdb.read_parquet(files).select("offset", "key", "value", "headers").to_arrow_table().to_pylist()
    # pyiceberg's scan gives a null list as an empty one (an optional list field, pyiceberg 0.12; checked with a
    # table of its own); DuckDB reads the files as Spark wrote them: null headers for a record without any
    rows = [{**r, "headers": r["headers"] or None} for r in rows]
    out = []
    for read in (rows, duck):
        digests = {r["offset"]: digest(r["offset"], r["key"], r["value"], header_pairs(r["headers"])) for r in read}
        assert len(digests) == len(read), "an offset is in the table twice"
        out.append(digests)
    return out[0], out[1], table


def test_iceberg_export_then_incremental_runs_hold_every_offset_once(
    tiered: Tiered,  # noqa: F811
    spark: SparkSession,  # noqa: F811
    props: dict[str, str],
    stack: Endpoints,
) -> None:
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
    assert table.location().startswith(props["warehouse"].split("://")[0] + "://")

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


def warehouse_files(props: dict[str, str]) -> list[str]:
    """The Parquet files under the catalog's warehouse, wherever it is (through pyiceberg's own FileIO)."""
    io = PyArrowFileIO(props)
    scheme, netloc, root = io.parse_location(props["warehouse"])
    fs = io.fs_by_scheme(scheme, netloc)
    found = fs.get_file_info(pafs.FileSelector(root, recursive=True, allow_not_found=True))
    return [f.path for f in found if f.is_file and f.path.endswith(".parquet")]


def test_a_run_killed_before_its_commit_adds_nothing_and_the_next_run_continues(
    tiered: Tiered,  # noqa: F811
    spark: SparkSession,  # noqa: F811
    props: dict[str, str],
) -> None:
    identifier = "lake.killed"
    env = {**os.environ, "TIERING_CRASH_AT": "export.files_written:1",
           **{f"PYICEBERG_CATALOG__TEST__{k.upper().replace('.', '__').replace('-', '_')}": v
              for k, v in props.items()}}  # fmt: skip
    run = subprocess.run(
        [sys.executable, "-m", "tiering", "export", tiered.topic, "--format", "iceberg", "--catalog", "test",
         "--path", identifier, "--incremental", "--master", "local[2]", "--config", str(tiered.config)],
        capture_output=True, text=True, timeout=600, env=env,
    )  # fmt: skip
    assert run.returncode == -9, run.stderr[-3000:]
    table = load_catalog("test", **props).load_table(identifier)
    assert table.current_snapshot() is None, "the killed run committed"
    written = warehouse_files(props)
    assert written, "the run was killed before it wrote anything: the test proved nothing"
    result = run_export(spark, ExportRequest(topic=tiered.topic, format="iceberg", path=identifier,
                                             store=tiered.settings.remote_storage, incremental=True,
                                             catalog="test", catalog_properties=props))  # fmt: skip
    (rng,) = result.ranges
    pyiceberg_rows, duckdb_rows, _ = table_digests(props, identifier)
    assert pyiceberg_rows == duckdb_rows == tiered.committed(rng.last, rng.first)
    assert not set(written) & set(warehouse_files(props)), "the killed run's files were left behind"


def test_a_catalog_pyiceberg_cannot_load_is_one_sentence_before_spark(tiered: Tiered, tmp_path: Path) -> None:  # noqa: F811
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYICEBERG_")}
    env["PYICEBERG_HOME"] = str(tmp_path)  # no .pyiceberg.yaml there: the catalog is not configured
    run = subprocess.run(
        [sys.executable, "-m", "tiering", "export", tiered.topic, "--format", "iceberg", "--catalog", "nowhere",
         "--path", "lake.none", "--config", str(tiered.config)],
        capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip
    assert run.returncode == 1, run.stderr[-2000:]
    assert "the Iceberg catalog 'nowhere' cannot be loaded" in run.stderr
    assert "Traceback" not in run.stderr and "SparkSession" not in run.stderr
