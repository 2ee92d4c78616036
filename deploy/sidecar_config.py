"""A sidecar configuration file for a broker of the local stack (used by the demo, handy by hand)."""

from __future__ import annotations

from pathlib import Path

import yaml

from deploy.stack import Endpoints


def write_sidecar_config(endpoints: Endpoints, broker_id: int = 1) -> Path:
    """Write ``<stack dir>/sidecar-<id>.yaml`` for ``tiering sidecar run --config`` and return its path."""
    broker = endpoints.broker(broker_id)
    stack_dir = Path(endpoints.stack_dir)
    config = {
        "bootstrap_servers": endpoints.bootstrap,
        "log_dirs": [broker.log_dir],
        "broker_id": broker_id,
        "state_dir": str(stack_dir / f"sidecar-{broker_id}-state"),
        "remote_storage": {
            "kind": "s3",
            "bucket": endpoints.s3.bucket,
            "prefix": "kafka-tiering",
            "endpoint_url": endpoints.s3.endpoint_url,
            "region": endpoints.s3.region,
            "path_style": True,
            "access_key_id": endpoints.s3.access_key,
            "secret_access_key": endpoints.s3.secret_key,
        },
        "etcd_url": endpoints.etcd.url,
        "rescan_interval_seconds": 2,
        "metrics_port": None,
    }
    path = stack_dir / f"sidecar-{broker_id}.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path
