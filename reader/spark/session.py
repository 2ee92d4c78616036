"""A SparkSession for the export: our data source registered, Delta enabled, jars from the local cache."""

from __future__ import annotations

import os

from pyspark.sql import SparkSession

from reader.spark.source import register


def export_session(master: str, jars: list[str], app_name: str = "tiering export",
                   conf: dict[str, str] | None = None) -> SparkSession:  # fmt: skip
    """Build (or join) the session. ``jars`` are passed with ``spark.jars`` (no download at run time).

    Executors import this package the way the driver does: ``PYTHONPATH`` is passed on to them.
    """
    builder = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.jars", ",".join(jars))
        .config("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension")
        .config("spark.sql.catalog.spark_catalog", "org.apache.spark.sql.delta.catalog.DeltaCatalog")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "8")
    )
    if master.startswith("local"):
        builder = builder.config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
    if os.environ.get("PYTHONPATH"):
        builder = builder.config("spark.executorEnv.PYTHONPATH", os.environ["PYTHONPATH"])
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark
