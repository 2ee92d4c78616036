"""A SparkSession for the export: our data source registered, Delta enabled, jars from the local cache."""

from __future__ import annotations

import os

from pyspark.sql import SparkSession

from reader.spark.jvm_jar import JvmReaderUnavailable, source_jar
from reader.spark.jvm_source import ENABLED_CONF
from reader.spark.source import register
from tiering_core.logs import get_logger

log = get_logger(__name__)


def export_session(master: str, jars: list[str], app_name: str = "tiering export",
                   conf: dict[str, str] | None = None) -> SparkSession:  # fmt: skip
    """Build (or join) the session with ``jars`` (no download at run time): on the driver's class path for a local
    master, whose executors run in the driver's JVM (``spark.jars`` would copy each jar into the session's
    temporary directory, 680 MB of them with hadoop-aws's AWS SDK), else with ``spark.jars``, which ships them
    to the cluster's executors.

    Executors import this package the way the driver does: ``PYTHONPATH`` is passed on to them. The JVM reader's
    jar (``reader.spark.jvm_jar``) is added, built first if needed; without a JDK to build it, ``kafka_tiered`` is
    read by its Python data source (``reader.spark.jvm_source.load`` picks).
    """
    try:
        jars = [*jars, str(source_jar(jars))]
        jvm_reader = True
    except JvmReaderUnavailable as exc:
        log.warning("kafka_tiered will be read by its Python data source", reason=str(exc))
        jvm_reader = False
    local = master.startswith("local")
    builder = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.driver.extraClassPath" if local else "spark.jars", (os.pathsep if local else ",").join(jars))
        .config("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension")
        .config("spark.sql.catalog.spark_catalog", "org.apache.spark.sql.delta.catalog.DeltaCatalog")
        .config("spark.sql.session.timeZone", "UTC")
        # Parquet's own timestamp type (INT64 microseconds, UTC) rather than Spark's default INT96, a legacy
        # encoding Parquet deprecated that other readers have to special-case (and Iceberg does not allow)
        .config("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "8")
        .config(ENABLED_CONF, str(jvm_reader).lower())
    )
    if local:
        builder = builder.config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
    if os.environ.get("PYTHONPATH"):
        builder = builder.config("spark.executorEnv.PYTHONPATH", os.environ["PYTHONPATH"])
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark
