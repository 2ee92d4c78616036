"""Spark export: the ``kafka_tiered`` PySpark data source over tiered segments, and the export job.

Importing this package needs pyspark and pyarrow; the rest of ``reader`` does not.
"""

from reader.spark.source import NAME, KafkaTieredDataSource, register

__all__ = ["NAME", "KafkaTieredDataSource", "register"]
