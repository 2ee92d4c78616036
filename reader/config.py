"""The reader's configuration: pydantic-settings from a YAML/TOML file and ``TIERING_*`` env vars.

The sidecar's configuration file works as it is (keys the reader does not use are ignored), so
``tiering consume --config /etc/tiering/sidecar.yaml`` needs nothing else; a client machine without a
sidecar gives ``bootstrap_servers`` and ``remote_storage`` (``tiering_core.stores.config``). Every
prefetch and cache bound is here, each with its reason.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import Field, model_validator
from pydantic_settings import SettingsConfigDict

from tiering_core.cluster_settings import ClusterSettings
from tiering_core.settings import load_settings_file

MIB = 1 << 20
MIN_WINDOW_BYTES = 64 * 1024  # a window holds at least a batch of a 64 KiB fetch, and few GETs per MiB


class ReaderSettings(ClusterSettings):
    model_config = SettingsConfigDict(env_prefix="TIERING_", env_nested_delimiter="__", extra="ignore")

    state_dir: Path | None = Field(
        default=None,
        description="A sidecar's state dir on this host: its local snapshots speed up recovery (optional; the "
        "remote snapshots are used anyway).",
    )
    prefetch_pool_bytes: int = Field(
        default=256 * MIB, ge=4 * MIB,
        description="Hard cap on downloaded bytes held in memory (read-ahead and data being decoded).",
    )  # fmt: skip
    fetch_window_bytes: int = Field(
        default=4 * MIB, ge=MIN_WINDOW_BYTES,
        description="Size of one ranged GET while reading sequentially (the unit of prefetch and disk cache).",
    )  # fmt: skip
    prefetch_windows: int = Field(
        default=8, ge=0, le=1024, description="Windows fetched ahead of a sequential reader, per partition."
    )
    download_max_concurrency: int = Field(default=4, ge=1, le=64, description="Ranged GETs in flight at once.")
    download_bytes_per_second: int | None = Field(
        default=None, ge=1, description="Download rate cap, so catch-up reads cannot starve the host (None: none)."
    )
    disk_cache_dir: Path | None = Field(default=None, description="Optional disk cache of downloaded windows.")
    disk_cache_bytes: int = Field(default=1 << 30, ge=MIB, description="Size cap of the disk cache.")
    index_cache_segments: int = Field(
        default=256, ge=1, description="Segments whose manifest and indexes stay cached (each a few KiB to MiB)."
    )
    read_attempts: int = Field(
        default=3, ge=1, le=20, description="Attempts of a GET while the store is unreachable (then an error)."
    )
    read_retry_backoff_seconds: float = Field(default=0.5, ge=0, description="First backoff; doubles per attempt.")
    hot_data_interval_seconds: float | None = Field(
        default=None, gt=0,
        description="When set, every this many seconds (while idle) warm the cache with the remote ranges that "
        "consumer groups will read next (committed offsets below the broker's log start).",
    )  # fmt: skip
    hot_data_windows: int = Field(default=4, ge=1, le=1024, description="Windows warmed per committed offset.")
    hot_data_max_groups: int = Field(default=100, ge=1, description="Consumer groups looked at per round.")

    @model_validator(mode="after")
    def _window_fits_pool(self) -> ReaderSettings:
        if self.fetch_window_bytes * 2 > self.prefetch_pool_bytes:
            raise ValueError(
                f"prefetch_pool_bytes ({self.prefetch_pool_bytes}) must hold at least two windows of "
                f"fetch_window_bytes ({self.fetch_window_bytes})"
            )
        return self


def load_reader_settings(config_file: Path | None = None, **overrides: Any) -> ReaderSettings:
    """Settings from ``config_file`` (.yaml/.yml/.toml), the environment and ``overrides``.

    Raises ConfigError naming the file and the invalid fields.
    """
    return load_settings_file(ReaderSettings, config_file, "reader configuration", **overrides)
