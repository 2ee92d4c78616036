"""``tiering reader ...``: serving tiered data to clients that do not run a TieredConsumer."""

from __future__ import annotations

from pathlib import Path

import click

from tiering.cli.common import check_cluster
from tiering.cli.log_options import LEVELS, service_logging
from tiering_core.errors import TieringError
from tiering_core.kafka_client import client_properties
from tiering_core.kafka_logs import admin_client

# Without --timeout: how long ``reader serve`` waits for the cluster at start (long enough for a compose file or
# a pod that starts beside the brokers).
START_TIMEOUT_SECONDS = 30.0


@click.group()
def reader() -> None:
    """Serve reads of tiered topics from remote storage."""


@reader.command("serve")
@click.option(
    "--config", "config_file", type=click.Path(dir_okay=False, path_type=Path), envvar="TIERING_CONFIG",
    default=None, help="Configuration file (YAML or TOML; a sidecar's file works, plus an `http` section). "
    "TIERING_* environment variables override it, e.g. TIERING_HTTP__TOKENS='[\"s3cret\"]'.",
)  # fmt: skip
@click.option("--host", default=None, help="Address to listen on (default: http.host, 127.0.0.1).")
@click.option("--port", type=click.IntRange(0, 65535), default=None, help="TCP port (default: http.port, 8470).")
@click.option("--log-level", type=click.Choice(LEVELS, case_sensitive=False), default=None,
              help="As the root option `tiering --log-level` [default: INFO].")  # fmt: skip
@click.option("--timeout", type=click.FloatRange(min=0.5), default=START_TIMEOUT_SECONDS, show_default=True,
              metavar="SECONDS", help="How long the Kafka cluster may take to answer at start; past it the service "
              "exits 1 naming it. Once started, a cluster that stops answering fails /readyz instead.")  # fmt: skip
def serve_command(config_file: Path | None, host: str | None, port: int | None, log_level: str | None,
                  timeout: float) -> None:  # fmt: skip
    """Serve records of tiered topics over HTTP, from remote storage, until SIGTERM.

    \b
    GET /v1/topics/T/partitions/P/batches?offset=N   raw record batches (any Kafka client decodes them)
    GET /v1/topics/T/partitions/P/records?offset=N   decoded records as JSON (encoding=base64|utf-8)
    GET /v1/topics/T/partitions/P                    remote start/end, broker log start/end
    /healthz  /readyz  /metrics (Prometheus)  /openapi.json

    Record endpoints take `Authorization: Bearer <token>` (http.tokens), max_bytes, max_records and
    isolation_level=read_committed|read_uncommitted. Offsets outside the remote data answer 416
    OFFSET_OUT_OF_RANGE naming the remote start/end and where the broker takes over. The service is
    stateless: run several behind a load balancer.
    """
    from reader.http import load_service_settings, serve

    service_logging(log_level)
    overrides = {k: v for k, v in (("host", host), ("port", port)) if v is not None}
    try:
        settings = load_service_settings(config_file)
        if overrides:
            settings = settings.model_copy(update={"http": settings.http.model_copy(update=overrides)})
        admin = admin_client({"bootstrap.servers": settings.bootstrap_servers,
                              **client_properties(settings.kafka_client)})  # fmt: skip
        check_cluster(admin, settings.bootstrap_servers, timeout)
        serve(settings)
    except TieringError as exc:
        raise click.ClickException(str(exc)) from exc
