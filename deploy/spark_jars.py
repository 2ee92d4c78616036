"""The jars Spark jobs add to PySpark's own: Delta Lake and Spark's Kafka source, from Maven Central.

Fetched once into the cache (``tiering dev fetch``, run by deploy/setup.sh) and passed with
``spark.jars``, so an export needs no network at run time. Transitive dependencies that PySpark
already ships (Hadoop, Parquet, Jackson, Scala, ...) are left out: two versions of one library on
the classpath is how jobs break in odd ways.
"""

from __future__ import annotations

import re
from pathlib import Path

from deploy.cache import cache_dir
from deploy.maven import fetch_pom

DELTA_VERSION = "4.4.0"
POM = Path(__file__).with_name("spark-pom.xml")
_VERSION_SUFFIX = re.compile(r"-\d[\w.]*(-\d+)?$")


def _pyspark() -> tuple[str, Path]:
    import pyspark

    return pyspark.__version__, Path(pyspark.__file__).parent / "jars"


def jars_dir() -> Path:
    spark_version, _ = _pyspark()
    return cache_dir() / f"spark-{spark_version}-delta-{DELTA_VERSION}"


def fetch_jars() -> Path:
    """Download the jars into the cache once (idempotent); return the directory."""
    spark_version, _ = _pyspark()
    binary = ".".join(spark_version.split(".")[:2])
    return fetch_pom(
        POM, jars_dir(), f"Delta {DELTA_VERSION} and Spark {spark_version}'s Kafka source jars",
        f"-Dspark.version={spark_version}", f"-Dspark.binary={binary}", f"-Ddelta.version={DELTA_VERSION}",
    )  # fmt: skip


def artifact(jar: str) -> str:
    """``delta-storage-4.4.0.jar`` -> ``delta-storage``."""
    return _VERSION_SUFFIX.sub("", jar.removesuffix(".jar"))


def spark_jars() -> list[str]:
    """Paths of the fetched jars that PySpark does not ship itself (fetching them first if needed)."""
    _, shipped_dir = _pyspark()
    shipped = {artifact(p.name) for p in shipped_dir.glob("*.jar")}
    return sorted(str(p) for p in fetch_jars().glob("*.jar") if artifact(p.name) not in shipped)
