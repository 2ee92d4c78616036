"""The jars a Spark export adds to PySpark's own (Delta Lake, Spark's Kafka source, spark-avro, hadoop-aws): where
they are.

They are fetched once from Maven Central by the local stack's setup (``deploy/spark_jars.py``, run by
``deploy/setup.sh`` and ``tiering dev fetch``) into ``$TIERING_CACHE_DIR`` (default ~/.cache/tiering), or
placed by the operator in ``$TIERING_SPARK_JARS_DIR``; an export only lists them, with no network and
nothing of the local stack at run time. Transitive dependencies that PySpark already ships (Hadoop,
Parquet, Jackson, Scala, ...) are left out: two versions of one library on the classpath is how jobs
break in odd ways.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from tiering_core.cache import cache_dir
from tiering_core.errors import TieringError

DELTA_VERSION = "4.4.0"
_VERSION_SUFFIX = re.compile(r"-\d[\w.]*(-\d+)?$")


def pyspark_jars() -> tuple[str, Path]:
    """PySpark's version and the directory of the jars it ships."""
    import pyspark

    return pyspark.__version__, Path(pyspark.__file__).parent / "jars"


def jars_dir() -> Path:
    """``$TIERING_SPARK_JARS_DIR``, else the cache's directory for this PySpark and Delta version."""
    configured = os.environ.get("TIERING_SPARK_JARS_DIR")
    if configured:
        return Path(configured).expanduser()
    spark_version, _ = pyspark_jars()
    # -avro-s3a: fetched with spark-avro and hadoop-aws (a cache of an older set is fetched again)
    return cache_dir() / f"spark-{spark_version}-delta-{DELTA_VERSION}-avro-s3a"


def hadoop_version() -> str:
    """The Hadoop version PySpark ships (of its ``hadoop-client-api`` jar): hadoop-aws must be the same."""
    _, shipped = pyspark_jars()
    for jar in shipped.glob("hadoop-client-api-*.jar"):
        return jar.name.removeprefix("hadoop-client-api-").removesuffix(".jar")
    raise TieringError(f"PySpark ships no hadoop-client-api jar in {shipped}: cannot choose hadoop-aws's version")


def artifact(jar: str) -> str:
    """``delta-storage-4.4.0.jar`` -> ``delta-storage``."""
    return _VERSION_SUFFIX.sub("", jar.removesuffix(".jar"))


def spark_jars(directory: Path | None = None) -> list[str]:
    """Paths of the jars in ``directory`` (default ``jars_dir()``) that PySpark does not ship itself. Raises
    TieringError naming the directory when Delta's jar is not there."""
    where = directory or jars_dir()
    _, shipped_dir = pyspark_jars()
    shipped = {artifact(p.name) for p in shipped_dir.glob("*.jar")}
    jars = sorted(str(p) for p in where.glob("*.jar") if artifact(p.name) not in shipped)
    names = [artifact(Path(j).name) for j in jars]
    if not any(n.startswith("delta-spark") for n in names) or not any(n.startswith("spark-avro") for n in names):
        raise TieringError(
            f"the Delta Lake, Spark Kafka source and spark-avro jars are not in {where}: fetch them once with "
            f"`python -m tiering dev fetch` (it needs Maven), or put delta-spark {DELTA_VERSION}, spark-avro and "
            f"their dependencies there and set TIERING_SPARK_JARS_DIR"
        )
    return jars
