"""Fetch the jars a Spark export adds to PySpark's own (Delta Lake and Spark's Kafka source) from Maven
Central, once, into the directory ``tiering_core.spark_jars`` lists them from at run time."""

from __future__ import annotations

from pathlib import Path

from deploy.maven import fetch_pom
from tiering_core import spark_jars as installed

POM = Path(__file__).with_name("spark-pom.xml")


def fetch_jars() -> Path:
    """Download the jars into the cache once (idempotent); return the directory."""
    spark_version, _ = installed.pyspark_jars()
    binary = ".".join(spark_version.split(".")[:2])
    delta = installed.DELTA_VERSION
    what = f"the Spark export's jars (Delta {delta}, spark-avro, Spark {spark_version}'s Kafka source, hadoop-aws)"
    return fetch_pom(
        POM, installed.jars_dir(), what,
        f"-Dspark.version={spark_version}", f"-Dspark.binary={binary}", f"-Ddelta.version={delta}",
        f"-Dhadoop.version={installed.hadoop_version()}",
    )  # fmt: skip


def spark_jars() -> list[str]:
    """The jars an export passes to Spark, fetched first if needed (the local stack and its tests)."""
    return installed.spark_jars(fetch_jars())
