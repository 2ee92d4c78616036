"""``tiering proxy ...``: the Kafka-protocol access layer, through which any Kafka client reads tiered history."""

from __future__ import annotations

from pathlib import Path

import click

from tiering.cli.log_options import LEVELS, service_logging
from tiering_core.errors import TieringError


@click.group()
def proxy() -> None:
    """Serve the Kafka protocol: any Kafka client reads tiered topics from offset 0, unchanged."""


@proxy.command("serve")
@click.option(
    "--config", "config_file", type=click.Path(dir_okay=False, path_type=Path), envvar="TIERING_CONFIG",
    default=None, help="Configuration file (YAML or TOML; a sidecar's or reader's file works, plus a `proxy` "
    "section). TIERING_* environment variables override it, e.g. TIERING_PROXY__ADVERTISED_HOST=kafka-proxy.",
)  # fmt: skip
@click.option("--host", default=None, help="Address to listen on (default: proxy.host, 127.0.0.1).")
@click.option("--bootstrap-port", type=click.IntRange(0, 65535), default=None,
              help="The port clients bootstrap to (default: proxy.bootstrap_port, 9192).")  # fmt: skip
@click.option("--log-level", type=click.Choice(LEVELS, case_sensitive=False), default=None,
              help="As the root option `tiering --log-level` [default: INFO].")  # fmt: skip
def serve_command(config_file: Path | None, host: str | None, bootstrap_port: int | None,
                  log_level: str | None) -> None:  # fmt: skip
    """Serve the Kafka protocol in front of the cluster until SIGTERM.

    \b
    Clients change only bootstrap.servers (to proxy.advertised_host:proxy.bootstrap_port). Each broker
    gets a port of its own (proxy.broker_ports, or proxy.broker_port_base + node id), and every address
    the cluster answers with is rewritten to the proxy's, so clients keep coming back through it.
    Everything is forwarded unchanged (produce, groups, transactions, admin, SASL) except:
      Fetch below the broker's log start     answered from remote storage (raw, CRC-checked batches)
      ListOffsets EARLIEST / by timestamp    the remote start / the remote time indexes
      OffsetForLeaderEpoch                   the remote leader-epoch checkpoints
    The proxy keeps no state but caches: run several behind one address. /metrics on proxy.metrics_port.
    """
    from reader.proxy import ProxyServer, load_proxy_settings

    service_logging(log_level)
    overrides = {k: v for k, v in (("host", host), ("bootstrap_port", bootstrap_port)) if v is not None}
    try:
        settings = load_proxy_settings(config_file)
        if overrides:
            settings = settings.model_copy(update={"proxy": settings.proxy.model_copy(update=overrides)})
        ProxyServer(settings).run()
    except TieringError as exc:
        raise click.ClickException(str(exc)) from exc
