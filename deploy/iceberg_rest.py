"""Iceberg's own REST catalog server, one local server: the REST catalog of the tests of ``tiering export --format
iceberg``. It is the server of the ``apache/iceberg-rest-fixture`` image (``RESTCatalogServer`` of iceberg-open-api's
test fixtures) run from its Maven Central jars, fetched once into the cache (``deploy/iceberg-rest-pom.xml``), and
configured as that image is: ``CATALOG_*`` environment variables become the backing catalog's properties (a
JdbcCatalog on a sqlite file here). ``deploy/LoopbackRESTCatalogServer.java`` starts it on 127.0.0.1 only, through
Java's source launcher, which needs a JDK (its compiler), not only a JRE."""

from __future__ import annotations

import shutil
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from deploy.errors import StackError
from deploy.kafka import java_binary
from deploy.maven import fetch_pom
from deploy.procs import spawn, stop_groups, wait_ready
from tiering_core.cache import cache_dir

ICEBERG_VERSION = "1.10.0"  # as in the pom
POM = Path(__file__).with_name("iceberg-rest-pom.xml")
LAUNCHER = Path(__file__).with_name("LoopbackRESTCatalogServer.java")
JVM_OPTS = ["-Xms64m", "-Xmx512m", "-Djava.awt.headless=true", "-XX:+ExitOnOutOfMemoryError"]


def jars_dir() -> Path:
    return cache_dir() / f"iceberg-rest-{ICEBERG_VERSION}"


def fetch_jars() -> Path:
    """Download the server's jars into the cache once (idempotent); return the directory."""
    return fetch_pom(POM, jars_dir(), f"Iceberg {ICEBERG_VERSION}'s REST catalog server jars")


@dataclass(frozen=True)
class IcebergRESTServer:
    port: int
    pid: int
    directory: Path

    @property
    def uri(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        stop_groups([self.pid])
        shutil.rmtree(self.directory, ignore_errors=True)


def start_rest_catalog(
    directory: Path, port: int, warehouse: str, properties: dict[str, str] | None = None
) -> IcebergRESTServer:
    """A new server on 127.0.0.1:``port`` with its catalog database and log in ``directory`` (created) and its
    tables under ``warehouse`` (``file:///...`` or ``s3://bucket/prefix``). ``properties`` are more of the backing
    catalog's properties as Iceberg names them, such as its FileIO's (``io-impl``, ``s3.endpoint``...). Raises
    StackError naming its log when it does not start."""
    jars = fetch_jars()
    directory.mkdir(parents=True, exist_ok=True)
    log = directory / "iceberg-rest.log"
    catalog = {"catalog-impl": "org.apache.iceberg.jdbc.JdbcCatalog", "uri": f"jdbc:sqlite:{directory}/catalog.db",
               "jdbc.strict-mode": "true", "warehouse": warehouse, **(properties or {})}  # fmt: skip
    argv = [java_binary(), *JVM_OPTS, "-cp", f"{jars}/*", str(LAUNCHER), "127.0.0.1", str(port)]
    pid = spawn(argv, log, env={_environment_name(k): v for k, v in catalog.items()}, cwd=directory)
    server = IcebergRESTServer(port, pid, directory)
    try:
        wait_ready("the Iceberg REST catalog", pid, lambda: _answers(server.uri), log, timeout=120)
    except StackError:
        stop_groups([pid])
        raise
    return server


def _environment_name(prop: str) -> str:
    """The image's variable of a catalog property (``s3.access-key-id`` -> ``CATALOG_S3_ACCESS__KEY__ID``)."""
    return "CATALOG_" + prop.replace("-", "__").replace(".", "_").upper()


def _answers(uri: str) -> bool:
    with urllib.request.urlopen(f"{uri}/v1/config", timeout=2) as resp:
        return bool(resp.status == 200)
