"""The data source's options, checked on the driver before any Spark work starts.

Names follow Spark's Kafka source where the concept exists: ``subscribe`` / ``subscribePattern`` /
``assign``, ``startingOffsets`` / ``endingOffsets`` (``earliest``/``latest`` or JSON, -2 earliest,
-1 latest, end exclusive), ``startingTimestamp`` / ``endingTimestamp`` (ms), ``failOnDataLoss``,
``kafka.*`` (the consumer of the optional ``includeLocalTail``).
The remote store is given with ``store.*`` options, the fields of the sidecar's ``remote_storage``
setting (``store.bucket``, ``store.prefix``, ``store.endpointUrl``, ``store.pathStyle``, ...; or
``store.kind=filesystem`` with ``store.root``), or whole as JSON in ``remoteStorage``.
``logStartOffsets`` (JSON ``{"<topic id>": {"<partition>": offset}}``, what ``tiering export`` reads from
the metadata) are log start offsets a user set with ``delete_records``: the records below them are left
out, as the broker leaves them out, also where a remote copy still holds them.
Option names are case-insensitive, as in Spark.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ValidationError

from reader.config import MIN_WINDOW_BYTES
from tiering_core.errors import ConfigError
from tiering_core.stores.config import STORE_CONFIGS, AnyStoreConfig

_KNOWN = {
    "subscribe", "subscribepattern", "assign", "topicids", "startingoffsets", "endingoffsets",
    "startingtimestamp", "endingtimestamp", "failondataloss", "maxslicebytes", "maxrowsperbatch",
    "windowbytes", "remotestorage", "path", "includelocaltail", "logstartoffsets",
}  # fmt: skip
_FIELD_NAMES = {n.replace("_", ""): n for model in STORE_CONFIGS for n in model.model_fields}


class ReadOptions(BaseModel):
    """Parsed options. Offsets maps are ``{topic: {partition: offset}}``."""

    topics: list[str] | None = None
    pattern: str | None = None
    assign: dict[str, list[int]] | None = None
    topic_ids: dict[str, str] = {}
    starting: dict[str, dict[int, int]] | None = None
    ending: dict[str, dict[int, int]] | None = None
    starting_timestamp: int | None = None
    ending_timestamp: int | None = None
    fail_on_data_loss: bool = True
    max_slice_bytes: int = 128 << 20
    max_rows_per_batch: int = 65536
    window_bytes: int = 16 << 20
    store: AnyStoreConfig
    include_local_tail: bool = False
    kafka: dict[str, str] = {}  # kafka.* options without the prefix: the local tail's consumer
    # topic id -> partition -> the log start offset a user set with delete_records (as the sidecar recorded
    # it): the records below are deleted for this read, as for the broker, also inside a copy holding them
    log_starts: dict[str, dict[int, int]] = {}

    def wanted(self, topic: str, partition: int) -> bool:
        if self.assign is not None:
            return partition in self.assign.get(topic, [])
        return True


def parse_options(options: Mapping[str, str]) -> ReadOptions:
    """Check and parse; ConfigError naming the option for anything wrong."""
    opts = {k.lower(): str(v) for k, v in options.items()}
    unknown = sorted(k for k in opts if k not in _KNOWN and not k.startswith(("store.", "kafka.")))
    if unknown:
        raise ConfigError(f"kafka_tiered: unknown option(s) {unknown}; known: {sorted(_KNOWN)}, store.* and kafka.*")
    chosen = [k for k in ("subscribe", "subscribepattern", "assign") if k in opts]
    if len(chosen) != 1:
        raise ConfigError("kafka_tiered: give exactly one of the options subscribe, subscribePattern, assign")
    values: dict[str, Any] = {"store": _store(opts)}
    if "subscribe" in opts:
        topics = [t.strip() for t in opts["subscribe"].split(",") if t.strip()]
        if not topics:
            raise ConfigError("kafka_tiered: option subscribe names no topic")
        values["topics"] = topics
    elif "subscribepattern" in opts:
        values["pattern"] = opts["subscribepattern"]
    else:
        assign = _json(opts, "assign")
        if not isinstance(assign, dict) or not all(isinstance(v, list) for v in assign.values()):
            raise ConfigError('kafka_tiered: option assign must be JSON like {"topic": [0, 1]}')
        values["assign"] = assign
        values["topics"] = sorted(assign)
    for name, key in (("starting", "startingoffsets"), ("ending", "endingoffsets")):
        if key in opts and opts[key] not in ("earliest", "latest"):
            values[name] = _offsets(opts, key)
        elif opts.get(key) == ("latest" if name == "starting" else "earliest"):
            raise ConfigError(f"kafka_tiered: option {key}={opts[key]!r} is not supported for a batch read")
    if "topicids" in opts:
        values["topic_ids"] = _json(opts, "topicids")
    for name, key in (("starting_timestamp", "startingtimestamp"), ("ending_timestamp", "endingtimestamp"),
                      ("max_slice_bytes", "maxslicebytes"), ("max_rows_per_batch", "maxrowsperbatch"),
                      ("window_bytes", "windowbytes"), ("fail_on_data_loss", "failondataloss"),
                      ("include_local_tail", "includelocaltail")):  # fmt: skip
        if key in opts:
            values[name] = opts[key]
    values["kafka"] = {k[6:]: v for k, v in opts.items() if k.startswith("kafka.")}
    if "logstartoffsets" in opts:
        values["log_starts"] = _json(opts, "logstartoffsets")
    try:
        parsed = ReadOptions.model_validate(values)
    except ValidationError as exc:
        raise ConfigError(f"kafka_tiered: bad option: {_first_error(exc)}") from exc
    if parsed.include_local_tail and "bootstrap.servers" not in parsed.kafka:
        raise ConfigError("kafka_tiered: includeLocalTail needs kafka.bootstrap.servers (the broker to read it from)")
    for name in ("max_slice_bytes", "max_rows_per_batch", "window_bytes"):
        if getattr(parsed, name) <= 0:
            raise ConfigError(f"kafka_tiered: option {name} must be positive")
    if parsed.window_bytes < MIN_WINDOW_BYTES:
        raise ConfigError(f"kafka_tiered: option windowBytes must be at least {MIN_WINDOW_BYTES} (64 KiB), the "
                          f"read core's smallest window; got {parsed.window_bytes}")  # fmt: skip
    return parsed


def _store(opts: dict[str, str]) -> dict[str, Any]:
    fields: dict[str, Any] = dict(_json(opts, "remotestorage")) if "remotestorage" in opts else {}
    for key, value in opts.items():
        if not key.startswith("store."):
            continue
        name = _FIELD_NAMES.get(key[6:].replace("_", ""))
        if name is None:
            known = ", ".join(f"store.{n}" for n in sorted(_FIELD_NAMES.values()))
            raise ConfigError(f"kafka_tiered: unknown store option {key!r}; known: {known}")
        fields[name] = value
    fields.setdefault("kind", "filesystem" if "root" in fields else "s3")
    if fields["kind"] == "s3" and "bucket" not in fields:
        raise ConfigError("kafka_tiered: the remote store is not configured: give store.bucket (or remoteStorage)")
    return fields


def _json(opts: dict[str, str], key: str) -> Any:
    try:
        return json.loads(opts[key])
    except json.JSONDecodeError as exc:
        raise ConfigError(f"kafka_tiered: option {key} is not valid JSON: {exc}") from exc


def _offsets(opts: dict[str, str], key: str) -> dict[str, dict[int, int]]:
    raw = _json(opts, key)
    try:
        return {str(t): {int(p): int(o) for p, o in parts.items()} for t, parts in raw.items()}
    except (AttributeError, ValueError, TypeError) as exc:
        raise ConfigError(f'kafka_tiered: option {key} must be "earliest", "latest" or JSON like '
                          f'{{"topic": {{"0": 23}}}}: {exc}') from exc  # fmt: skip


def _first_error(exc: ValidationError) -> str:
    err = exc.errors()[0]
    return f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}"


def store_options(config: AnyStoreConfig) -> dict[str, str]:
    """The options that pass ``config`` to the data source. The secret key travels in its own option,
    ``store.secretAccessKey``, whose name Spark's redaction (``spark.redaction.regex``) hides in plans and logs."""
    options = {"remoteStorage": config.model_dump_json(exclude_none=True, exclude={"secret_access_key"})}
    secret = config.secret_key()
    if secret is not None:
        options["store.secretAccessKey"] = secret
    return options
