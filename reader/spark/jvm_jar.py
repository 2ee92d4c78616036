"""The JVM reader's jar (``reader/spark/jvm/``, the ``kafka_tiered_slices`` DataSource V2): built from its Java
sources on first use with the JDK's ``javac``, against the installed PySpark's own jars and the Kafka client jar
of the export's jars, and cached by a hash of all three (a new PySpark or source builds it again).

Built here rather than fetched: the reader is a few hundred lines that must match the installed Spark's
DataSource V2 and vector classes exactly, and compiling against the very jars Spark runs with takes seconds and
needs no Maven (a Maven build would first download Spark's whole dependency tree for its compile class path).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
import zipfile
from pathlib import Path

from tiering_core.cache import cache_dir
from tiering_core.errors import TieringError
from tiering_core.spark_jars import artifact, pyspark_jars, spark_jars

SOURCES = Path(__file__).with_name("jvm")
JAR_NAME = "kafka-tiered-spark-source.jar"


class JvmReaderUnavailable(TieringError):
    """The JVM reader cannot be built here (no JDK, or no Kafka client jar among the export's jars)."""


def source_jar(jars: list[str]) -> Path:
    """The jar, built once per input (sources, PySpark version, Kafka client jar); ``jars`` are the export's jars
    (``tiering_core.spark_jars.spark_jars``), where the Kafka client jar is. Raises JvmReaderUnavailable."""
    clients = [Path(j) for j in jars if artifact(Path(j).name) == "kafka-clients"]
    if not clients:
        raise JvmReaderUnavailable(f"no kafka-clients jar among the export's jars {jars}: fetch them with "
                                   "`python -m tiering dev fetch`")  # fmt: skip
    spark_version, spark_dir = pyspark_jars()
    digest = hashlib.sha256(f"{spark_version} {clients[0].name}".encode())
    for path in sorted(p for p in SOURCES.rglob("*") if p.is_file()):
        digest.update(path.relative_to(SOURCES).as_posix().encode() + b"\0" + path.read_bytes())
    jar = cache_dir() / f"spark-source-{digest.hexdigest()[:16]}" / JAR_NAME
    if not jar.exists():
        _build(jar, spark_dir, clients[0])
    return jar


def _build(jar: Path, spark_dir: Path, kafka_clients: Path) -> None:
    home = os.environ.get("JAVA_HOME")
    javac = (home and shutil.which("javac", path=os.path.join(home, "bin"))) or shutil.which("javac")
    if javac is None:
        raise JvmReaderUnavailable("no javac (a JDK 17 or later) to build the JVM reader of kafka_tiered")
    jar.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="spark-source-", dir=jar.parent) as tmp:
        classes = Path(tmp) / "classes"
        sources = [str(p) for p in SOURCES.rglob("*.java")]
        classpath = os.pathsep.join([str(spark_dir / "*"), str(kafka_clients)])
        done = subprocess.run([javac, "--release", "17", "-nowarn", "-d", str(classes), "-cp", classpath, *sources],
                              capture_output=True, text=True)  # fmt: skip
        if done.returncode != 0:
            raise JvmReaderUnavailable(f"javac failed building the JVM reader:\n{done.stderr[-4000:]}")
        built = Path(tmp) / JAR_NAME
        with zipfile.ZipFile(built, "w", zipfile.ZIP_DEFLATED) as out:
            for path in sorted(classes.rglob("*.class")):
                out.write(path, path.relative_to(classes).as_posix())
            for path in sorted((SOURCES / "META-INF").rglob("*")):
                if path.is_file():
                    out.write(path, path.relative_to(SOURCES).as_posix())
        os.replace(built, jar)  # atomic: a concurrent build leaves one whole jar


if __name__ == "__main__":  # python -m reader.spark.jvm_jar: the jar's path, built first if needed
    print(source_jar(spark_jars()))
