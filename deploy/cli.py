"""``tiering dev``: the local stack for the quickstart, the demo, the benchmarks and the tests."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from deploy import images, stack
from deploy.errors import StackError

REDACTED = "<redacted>"


def default_stack_dir() -> Path:
    return Path(os.environ.get("TIERING_DEV_DIR", ".tiering/dev"))


_dir_option = click.option(
    "--dir",
    "stack_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=default_stack_dir,
    show_default="$TIERING_DEV_DIR or ./.tiering/dev",
    help="Directory holding the stack's data, logs and endpoints.json.",
)


@click.group()
def dev() -> None:
    """Start, stop and inspect the local stack: Apache Kafka (KRaft), MinIO (S3) and etcd.

    Everything runs as local processes on 127.0.0.1 with free ports; `endpoints.json` in the stack
    directory records where, for every other command to read.
    """


@dev.command()
@_dir_option
@click.option("--brokers", type=click.IntRange(1, 5), default=1, show_default=True, help="Kafka nodes to run.")
@click.option(
    "--backend",
    type=click.Choice(stack.BACKENDS),
    default=None,
    help="processes (local processes; the default for a new stack) or containers (podman, local images).",
)
def up(stack_dir: Path, brokers: int, backend: stack.Backend | None) -> None:
    """Start the stack, or start a stopped one again on its data.

    Idempotent: on a running stack it prints the same endpoints. The broker count and the backend of
    an existing stack directory cannot change (use another --dir).
    """
    try:
        endpoints = stack.start(stack_dir, brokers=brokers, backend=backend)
    except StackError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(f"bootstrap.servers={endpoints.bootstrap}")
    click.echo(f"s3 endpoint={endpoints.s3.endpoint_url} bucket={endpoints.s3.bucket}")
    click.echo(f"etcd={endpoints.etcd.url}")
    click.echo(f"endpoints file: {Path(endpoints.stack_dir) / stack.ENDPOINTS}")


@dev.command()
@_dir_option
def down(stack_dir: Path) -> None:
    """Stop every process of the stack (idempotent). Data and logs stay in the stack directory."""
    stack.stop(stack_dir)
    click.echo(f"stopped the stack in {stack_dir}")


@dev.command()
@_dir_option
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table (the S3 secret key redacted).")
def status(stack_dir: Path, as_json: bool) -> None:
    """Show each component of the stack, whether it runs, and where it listens.

    Exits 0 when every component runs, 1 when there is no stack or a component is down (as scripts expect).
    """
    info = stack.status(stack_dir)
    if as_json:
        s3 = info.get("s3")
        if isinstance(s3, dict) and s3.get("secret_key"):
            s3["secret_key"] = REDACTED  # the file holds it for the tests and the demo; a status is shown and pasted
        click.echo(json.dumps(info, indent=2))
        if not info["running"]:
            sys.exit(1)
        return
    if "alive" not in info:
        raise click.ClickException(f"no stack in {stack_dir} (start one with `tiering dev up`)")
    endpoints = stack.Endpoints.load(Path(stack_dir) / stack.ENDPOINTS)
    alive = stack.components_alive(endpoints)
    net = endpoints.containers
    table = Table(title=f"local stack in {stack_dir} ({endpoints.backend})")
    for col in ("component", "running", "container" if net else "pid", "endpoint"):
        table.add_column(col)
    for b in endpoints.brokers:
        table.add_row(f"kafka-{b.id}", str(alive[f"kafka-{b.id}"]), str(b.container or b.pid), b.host_port)
    table.add_row("minio", str(alive["minio"]), net.minio if net else str(endpoints.s3.pid), endpoints.s3.endpoint_url)
    table.add_row("etcd", str(alive["etcd"]), net.etcd if net else str(endpoints.etcd.pid), endpoints.etcd.url)
    Console().print(table)
    down = [name for name, up in alive.items() if not up]
    if down:
        raise click.ClickException(f"not running: {', '.join(down)} (restart the stack with `tiering dev up`)")


@dev.command()
def fetch() -> None:
    """Download the jars (Kafka, Delta, Spark's Kafka source) and build MinIO, once, into the cache; start nothing."""
    try:
        stack.fetch()
    except StackError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo("Kafka, Delta and Spark Kafka source jars and MinIO are in the cache")


@dev.command(name="images")
@click.argument("names", nargs=-1, type=click.Choice(images.ALL_IMAGES))
def build_images(names: tuple[str, ...]) -> None:
    """Build the containers backend's local images (all, or NAMES and their parents), unless cached.

    Each image is tagged with a hash of its inputs, so only an image whose inputs changed is rebuilt.
    Prints one line per image: cached, or built and how long it took. Needs podman, runc and
    debootstrap (deploy/setup.sh installs them).
    """
    try:
        images.ensure_images(names or images.ALL_IMAGES, log=click.echo)
    except StackError as exc:
        raise click.ClickException(str(exc)) from exc
