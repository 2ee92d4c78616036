"""The shared base every package of the project imports downward.

Errors, structured logs, Kafka's on-disk formats, the remote object layout and manifest, the
remote stores (S3, filesystem), rate limiting, producing without loss and the Kafka admin calls.
It imports nothing from ``segment_fsm``, ``metadata``, ``reader``, ``tiering`` or ``deploy``;
CI checks the layering (``tests/unit/test_layering.py``).
"""
