"""Options and helpers shared by the operator commands."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import click
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from metadata import WalMissing
from tiering.config import SidecarSettings, load_settings
from tiering.sidecar.context import SidecarContext
from tiering_core.errors import TieringError
from tiering_core.kafka_cluster import kafka_error_text
from tiering_core.stores.base import RemoteStore, RemoteStoreError
from tiering_core.stores.config import StoreConfig
from tiering_core.stores.factory import open_store

config_option = click.option(
    "--config",
    "config_file",
    type=click.Path(dir_okay=False, path_type=Path),
    envvar="TIERING_CONFIG",
    show_envvar=True,
    default=None,
    help="Configuration file (YAML or TOML), default: $TIERING_CONFIG; TIERING_* environment variables override "
    "it. A sidecar's file works; from any other host bootstrap_servers, kafka_client and remote_storage are enough.",
)

# How long an operator's command waits for Kafka and the store when --timeout is not given.
DEFAULT_TIMEOUT_SECONDS = 10.0
timeout_option = click.option(
    "--timeout",
    type=click.FloatRange(min=0.5),
    default=DEFAULT_TIMEOUT_SECONDS,
    show_default=True,
    metavar="SECONDS",
    help="How long Kafka and the remote store may take to answer; past it the command exits 1 naming what did "
    "not answer.",
)


def cluster_options(command: Callable[..., None]) -> Callable[..., None]:
    """--config and --timeout, the options of every command that talks to the cluster."""
    return config_option(timeout_option(command))


yes_option = click.option("--yes", is_flag=True, help="Do what the command destroys without asking.")


def confirm_or_refuse(question: str, yes: bool, nothing_done: str) -> None:
    """Go on when ``yes`` or when the user confirms at a terminal; otherwise stop (exit 1) saying
    ``nothing_done``. Without a terminal on stdin there is nobody to ask: only --yes confirms."""
    if yes:
        return
    if not sys.stdin.isatty():
        raise click.ClickException(f"not confirmed (stdin is not a terminal): {nothing_done}; run again with --yes")
    if not click.confirm(question, default=False):
        raise click.ClickException(f"not confirmed: {nothing_done}")


def settings_from(config_file: Path | None) -> SidecarSettings:
    try:
        return load_settings(config_file)
    except TieringError as exc:
        raise click.ClickException(str(exc)) from exc


# An admin command's store requests fail fast (a few seconds) when the store does not answer, instead of the
# sidecar's patient retries (5 attempts of up to 5 s to connect: 22-25 s with the store down).
ADMIN_STORE_CONNECT_SECONDS = 2.0
ADMIN_STORE_ATTEMPTS = 2


def admin_store(config: StoreConfig, timeout: float) -> StoreConfig:
    """``config`` with an operator command's bounds: a short connect timeout, few attempts, reads within
    ``timeout``."""
    return config.bounded(ADMIN_STORE_CONNECT_SECONDS, timeout, ADMIN_STORE_ATTEMPTS)


@dataclass
class Admin:
    """What an operator's command works with: the context, and what it could not learn."""

    ctx: SidecarContext
    store_error: str | None  # the store did not answer (or refused): the sentence to show; None when it did
    no_metadata: str | None  # read-only commands: the metadata WAL topic does not exist (nothing is tiered)

    def fail_if_store_unreachable(self) -> None:
        """Exit 1 with the store's sentence, after a status has shown what it knows without the store."""
        if self.store_error is not None:
            raise click.ClickException(self.store_error)


def _store_problem(store: RemoteStore) -> str | None:
    """One cheap request (HEAD of a key that need not exist): None when the store answers, else the sentence."""
    try:
        store.head(".probe")
    except RemoteStoreError as exc:  # StoreUnavailable (unreachable) or refused (credentials, bucket): it says which
        return str(exc)
    return None


def check_cluster(admin: AdminClient, bootstrap: str, timeout: float) -> None:
    """One metadata request, so that an unreachable cluster is one sentence (exit 1) within ``timeout``."""
    try:
        admin.list_topics(timeout=timeout)
    except KafkaException as exc:
        raise click.ClickException(
            f"cannot reach the Kafka cluster at {bootstrap} within {timeout:g} s: {kafka_error_text(exc.args[0])}"
        ) from None


@contextmanager
def admin_context(config_file: Path | None, timeout: float, *, read_only: bool = False,
                  store_needed: bool = False) -> Iterator[Admin]:  # fmt: skip
    """A started metadata manager (recovered, following the WAL) for one operator's command, from any host.

    Every request waits at most ``timeout`` seconds. An unreachable cluster exits 1 at once. A store that does
    not answer is skipped (the metadata is recovered from the WAL alone) and reported: on stderr here, or by the
    command through ``Admin.store_error`` when ``read_only``; exit 1 at once when ``store_needed``.
    ``read_only`` commands create nothing: without the metadata WAL topic, ``Admin.no_metadata`` says why.
    """
    settings = settings_from(config_file)
    try:
        store = open_store(admin_store(settings.remote_storage, timeout))
        store_error = _store_problem(store)
        ctx = SidecarContext.for_admin(settings, store, timeout=timeout, read_only=read_only,
                                       store_reachable=store_error is None)  # fmt: skip
    except TieringError as exc:  # a store that cannot be set up...
        raise click.ClickException(str(exc)) from exc
    try:
        check_cluster(ctx.cluster.admin, ctx.cluster.bootstrap, timeout)
        if store_error is not None and store_needed:
            raise click.ClickException(f"{store_error}; nothing was changed")
        if store_error is not None and not read_only:
            click.echo(f"Warning: {store_error}; the metadata is recovered from the WAL alone", err=True)
        no_metadata = None
        try:
            ctx.manager.start()
        except WalMissing as exc:  # read-only: nothing was created, nothing is tiered
            no_metadata = str(exc)
        yield Admin(ctx, store_error, no_metadata)
    except TieringError as exc:
        raise click.ClickException(str(exc)) from exc
    except KafkaException as exc:  # a client call outside KafkaCluster's checks: a sentence, not KafkaError{...}
        raise click.ClickException(
            f"Kafka at {ctx.cluster.bootstrap} answered: {kafka_error_text(exc.args[0])}"
        ) from exc
    finally:
        ctx.close()
