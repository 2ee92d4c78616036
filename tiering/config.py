"""The sidecar's configuration: pydantic-settings, from a YAML or TOML file and ``TIERING_*`` env vars.

Precedence: explicit arguments, then environment variables (``TIERING_BOOTSTRAP_SERVERS``, nested with
``__``: ``TIERING_REMOTE_STORAGE__BUCKET``), then the file given with ``--config``, then defaults
(``tiering_core.settings``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

from pydantic import Field, field_validator, model_validator
from pydantic_settings import NoDecode, SettingsConfigDict

from tiering_core.backoff import Backoff
from tiering_core.cluster_settings import ClusterSettings
from tiering_core.errors import ConfigError
from tiering_core.settings import load_settings_file


class SidecarSettings(ClusterSettings):
    model_config = SettingsConfigDict(env_prefix="TIERING_", env_nested_delimiter="__", extra="forbid")

    log_dirs: Annotated[list[Path], NoDecode] = Field(
        default_factory=list,
        description="The broker's log.dirs (comma-separated in env); `sidecar run` needs them, `topic` and "
        "`cluster` commands (run from any host) do not.",
    )
    broker_id: int | None = Field(
        default=None, description="This broker's node.id (sidecar run only); default: from meta.properties."
    )
    state_dir: Path = Field(default=Path("/var/lib/tiering"), description="Snapshots and the status file.")
    metadata_partitions: int = Field(default=50, ge=1, le=1000)
    snapshot_every_records: int = Field(default=100_000, ge=1)
    snapshot_every_seconds: float = Field(default=300.0, gt=0)
    etcd_url: str | None = Field(default=None, description="Partition leases in etcd (optional).")
    etcd_lease_ttl_seconds: int = Field(default=10, ge=2)
    rescan_interval_seconds: float = Field(default=30.0, gt=0, description="Full rescan even without events.")
    upload_max_concurrency: int = Field(default=2, ge=1, le=64, description="Segments uploaded at once.")
    upload_bytes_per_second: int | None = Field(default=None, ge=1, description="Upload rate cap (None: none).")
    copy_started_timeout_seconds: float = Field(
        default=900.0, gt=0, description="A COPY_SEGMENT_STARTED older than this is abandoned and swept."
    )
    orphan_sweep_interval_seconds: float = Field(
        default=3600.0, gt=0,
        description="How often a partition's sweep lists its objects for orphans (one LIST per partition; also "
        "on its first step after a start or a leadership change). Spread by +-25 % so partitions do not list at once.",
    )  # fmt: skip
    unchanged_partition_recheck_seconds: float = Field(
        default=3600.0, gt=0,
        description="A partition whose inputs (its directory, Kafka's offsets and leader epoch, its topic's configs "
        "and tiering state, its remote metadata) did not change since a step that left nothing to do is not stepped "
        "again until a time-based rule (retention.ms, local.retention.ms, a stale copy, the orphan listing) can fire, "
        "or this long (+-25 %) has passed: a bound for anything those inputs might miss (the rules themselves fire at "
        "their exact time). Each recheck is a full step (about 2 ms of CPU): at 2,000 partitions and 300 s they cost "
        "an idle broker about 1.3 % of a core.",
    )  # fmt: skip
    remote_log_manager_incomplete_upload_abort_ms: int = Field(
        default=3_600_000, ge=1,
        description="A multipart upload under the prefix begun longer ago than this is aborted by the sweeper. A "
        "process killed mid-upload (kill -9, OOM, a lost host) leaves its upload behind, and S3 keeps (and bills) "
        "its parts until it is aborted, while no object listing shows them. Longer than any upload can take (one "
        "still running when aborted fails and is copied again), and at least copy_started_timeout_seconds.",
    )  # fmt: skip
    remote_log_manager_task_retry_backoff_ms: int = Field(
        default=500, ge=1, description="First wait before retrying a failed operation (Kafka's name and default)."
    )
    remote_log_manager_task_retry_backoff_max_ms: int = Field(
        default=30_000, ge=1, description="Longest wait between retries; the wait doubles up to it."
    )
    remote_log_manager_task_retry_jitter: float = Field(
        default=0.2, ge=0, lt=1, description="Random factor +-jitter on each wait, so retries spread out."
    )
    deleted_topic_grace_seconds: float = Field(
        default=3600.0, ge=0,
        description="A tiered topic's remote data is deleted only after Kafka has answered, for this long and "
        "in at least 3 answers in a row, that its topic id does not exist (time the sidecar did not watch does "
        "not count).",
    )  # fmt: skip
    lag_refresh_seconds: float = Field(
        default=10.0, gt=0, description="How often the copy-lag gauges are refreshed, also during a long tick."
    )
    metrics_port: int | None = Field(default=9464, description="Prometheus /metrics and /status (None: off).")
    metrics_host: str = "127.0.0.1"

    def retry_backoff(self) -> Backoff:
        initial = self.remote_log_manager_task_retry_backoff_ms / 1000
        return Backoff(initial, max(initial, self.remote_log_manager_task_retry_backoff_max_ms / 1000),
                       self.remote_log_manager_task_retry_jitter)  # fmt: skip

    @model_validator(mode="after")
    def _abort_after_copy_timeout(self) -> SidecarSettings:
        if self.remote_log_manager_incomplete_upload_abort_ms < self.copy_started_timeout_seconds * 1000:
            raise ValueError(
                "remote_log_manager_incomplete_upload_abort_ms must be at least copy_started_timeout_seconds x 1000: "
                "an upload must not be aborted while its copy may still finish"
            )
        return self

    @field_validator("log_dirs", mode="before")
    @classmethod
    def _split_log_dirs(cls, value: Any) -> Any:
        return value.split(",") if isinstance(value, str) else value

    def resolve_broker_id(self) -> int:
        """``broker_id``, else ``node.id`` (or ``broker.id``) from meta.properties in the log dirs."""
        if self.broker_id is not None:
            return self.broker_id
        for log_dir in self.log_dirs:
            try:
                text = (log_dir / "meta.properties").read_text()
            except FileNotFoundError:
                continue
            props = dict(line.split("=", 1) for line in text.splitlines() if "=" in line and not line.startswith("#"))
            for key in ("node.id", "broker.id"):
                if key in props:
                    return int(props[key])
        dirs = ", ".join(str(d) for d in self.log_dirs) or "(none)"
        raise ConfigError(
            f"broker_id is not set and no meta.properties with node.id in log_dirs {dirs}: set broker_id "
            "(TIERING_BROKER_ID) or log_dirs to the broker's log.dirs"
        )


def load_settings(config_file: Path | None = None, **overrides: Any) -> SidecarSettings:
    """Settings from ``config_file`` (.yaml/.yml/.toml), the environment and ``overrides``.

    Raises ConfigError naming the file and the invalid fields.
    """
    return load_settings_file(SidecarSettings, config_file, "sidecar configuration", **overrides)
