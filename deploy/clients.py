"""Clients of a running stack, the same for both backends: S3 (boto3) and readiness checks."""

from __future__ import annotations

from typing import Any

import boto3
from botocore.config import Config
from confluent_kafka.admin import AdminClient

from deploy.endpoints import BrokerEndpoint, Endpoints


def s3_client(endpoints: Endpoints) -> Any:
    """A boto3 S3 client for the stack's MinIO (path-style addressing)."""
    return boto3.client(
        "s3",
        endpoint_url=endpoints.s3.endpoint_url,
        aws_access_key_id=endpoints.s3.access_key,
        aws_secret_access_key=endpoints.s3.secret_key,
        region_name=endpoints.s3.region,
        config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 3}),
    )


def ensure_bucket(endpoints: Endpoints) -> None:
    """Create the stack's bucket unless it exists; idempotent."""
    client = s3_client(endpoints)
    existing = {b["Name"] for b in client.list_buckets().get("Buckets", [])}
    if endpoints.s3.bucket not in existing:
        client.create_bucket(Bucket=endpoints.s3.bucket)


def broker_serving(broker: BrokerEndpoint, n: int) -> bool:
    """True when ``broker`` itself answers a metadata request listing all ``n`` brokers.

    Asking the broker itself (not the cluster) matters after a restart: the cluster keeps listing a
    killed broker until its session times out, so a cluster-wide count can be stale.
    """
    admin = AdminClient({"bootstrap.servers": broker.host_port, "socket.timeout.ms": 2000, "log_level": 0})
    metadata = admin.list_topics(timeout=3)
    return metadata.orig_broker_id == broker.id and len(metadata.brokers) >= n
