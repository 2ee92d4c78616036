"""Tiered storage for existing Apache Kafka clusters.

The ``tiering`` package is the sidecar and everything shared by it and the reader: configuration,
Kafka's on-disk formats, the remote object stores, upload, retention, the CLI and metrics.
"""

__version__ = "0.1.0"
