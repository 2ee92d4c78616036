"""The HTTP fetch service's configuration: the reader's settings plus an ``http`` section.

One file serves the sidecar, the reader and the service (keys a part does not use are ignored), so
``tiering reader serve --config /etc/tiering/sidecar.yaml`` works with the ``http`` section added, or
with ``TIERING_HTTP__TOKENS='["..."]'`` alone. Every bound on a request's or a response's size is
here, each with its reason.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, SecretStr, model_validator

from reader.config import MIB, ReaderSettings
from tiering_core.settings import load_settings_file


class HttpSettings(BaseModel):
    """Where the service listens, who may read, and how much one request may ask for."""

    host: str = Field(
        default="127.0.0.1",
        description="Address to listen on. Loopback unless set: put the service behind a load balancer or "
        "set 0.0.0.0 deliberately.",
    )
    port: int = Field(default=8470, ge=0, le=65535, description="TCP port (0: any free port).")
    tokens: list[SecretStr] = Field(
        default_factory=list,
        description="Bearer tokens accepted on the record endpoints (any one of them). Several allow rotation.",
    )
    allow_unauthenticated: bool = Field(
        default=False,
        description="Serve records without a token. Refused unless set explicitly, so a missing token list "
        "never opens the data by accident.",
    )
    default_fetch_bytes: int = Field(
        default=MIB, ge=1, description="max_bytes of a request that gives none (Kafka's max.partition.fetch.bytes)."
    )
    max_fetch_bytes: int = Field(
        default=16 * MIB, ge=1024,
        description="Largest max_bytes a request may ask for. A response holds at most this much plus the one "
        "batch that straddles the limit (Kafka serves at least one whole batch, as here).",
    )  # fmt: skip
    default_records: int = Field(default=500, ge=1, description="max_records of a JSON request that gives none.")
    max_records: int = Field(default=10_000, ge=1, description="Largest max_records a JSON request may ask for.")
    max_concurrent_requests: int = Field(
        default=64, ge=1,
        description="Open connections (idle keep-alive ones included) and requests in progress allowed at once; "
        "past it a request is answered 503 at once. A request holds at most about max_fetch_bytes of the "
        "reader's memory pool, which waits for room when full.",
    )  # fmt: skip
    ready_timeout_seconds: float = Field(
        default=5.0, gt=0, description="How long /readyz waits for the metadata to catch up before saying no."
    )
    cursors: int = Field(
        default=256, ge=1,
        description="Partitions read ahead between requests: a client's next request (at the next_offset the "
        "last answer gave) finds its data downloaded. A cache: past it the least recently used is dropped.",
    )  # fmt: skip
    memory_wait_seconds: float = Field(
        default=5.0, gt=0,
        description="How long a request waits for room in the memory pool before it is answered 503 with "
        "Retry-After (read-ahead gives its room back first).",
    )  # fmt: skip

    @model_validator(mode="after")
    def _consistent(self) -> HttpSettings:
        if self.default_fetch_bytes > self.max_fetch_bytes:
            raise ValueError(f"default_fetch_bytes ({self.default_fetch_bytes}) exceeds max_fetch_bytes "
                             f"({self.max_fetch_bytes})")  # fmt: skip
        if self.default_records > self.max_records:
            raise ValueError(f"default_records ({self.default_records}) exceeds max_records ({self.max_records})")
        if not self.tokens and not self.allow_unauthenticated:
            raise ValueError(
                "no bearer token configured: set http.tokens (TIERING_HTTP__TOKENS='[\"...\"]'), or "
                "http.allow_unauthenticated: true to serve records to anyone who can connect"
            )
        if any(not t.get_secret_value() for t in self.tokens):
            raise ValueError("http.tokens holds an empty token")
        return self


class ServiceSettings(ReaderSettings):
    http: HttpSettings = Field(default_factory=HttpSettings, description="The HTTP fetch service.")

    @model_validator(mode="after")
    def _fetch_fits_pool(self) -> ServiceSettings:
        if self.http.max_fetch_bytes * 2 > self.prefetch_pool_bytes:
            raise ValueError(
                f"prefetch_pool_bytes ({self.prefetch_pool_bytes}) must hold at least two requests of "
                f"http.max_fetch_bytes ({self.http.max_fetch_bytes})"
            )
        return self


def load_service_settings(config_file: Path | None = None, **overrides: Any) -> ServiceSettings:
    """Settings from ``config_file`` (.yaml/.yml/.toml), the environment and ``overrides``.

    Raises ConfigError naming the file and the invalid fields (a missing token list included).
    """
    return load_settings_file(ServiceSettings, config_file, "reader service configuration", **overrides)
