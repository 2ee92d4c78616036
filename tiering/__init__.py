"""Tiered storage for existing Apache Kafka clusters.

The ``tiering`` package is the sidecar beside each broker (copy, retention, sweeping), its
configuration, policy and metrics, and the ``tiering`` command line. The shared base it builds on
(errors, logs, Kafka's formats, the remote stores) lives in ``tiering_core``.
"""

__version__ = "0.1.0"
