"""The ``kafka_client`` settings: librdkafka properties given to every Kafka client the project makes.

The sidecar's admin client, the metadata WAL's producer and consumer, the reader's catalog, consumer
and HTTP service, and the CLI's commands all connect with them, so clusters whose listeners need SASL
and/or TLS can be used::

    kafka_client:
      security.protocol: SASL_SSL
      sasl.mechanism: SCRAM-SHA-512
      sasl.username: tiering
      sasl.password: "..."                  # a SecretStr: never in logs, errors or repr
      ssl.ca.location: /etc/kafka/ca.pem

or ``TIERING_KAFKA_CLIENT__SASL_PASSWORD=...`` (in a key, ``_`` stands for ``.``: ``sasl_password`` is
``sasl.password``). Any librdkafka property passes through (its CONFIGURATION.md); keys are checked only
lightly here: the shape of a property name, and the few the clients set themselves for correctness.
librdkafka checks names and values when a client is made, and ``make_client`` turns its refusal into a
ConfigError naming ``kafka_client``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Annotated, Any, TypeVar

from confluent_kafka import KafkaError, KafkaException
from pydantic import BeforeValidator, SecretStr

from tiering_core.errors import ConfigError

C = TypeVar("C")
_NAME = re.compile(r"[a-z0-9]+(\.[a-z0-9]+)*")
# set by the clients themselves: overriding them would break what the project relies on
_RESERVED = {
    "bootstrap.servers": "set bootstrap_servers instead",
    "group.id": "each client sets its own consumer group",
    "enable.idempotence": "the metadata WAL's producer needs idempotence",
    "acks": "the metadata WAL's producer needs acks=all",
    "transactional.id": "no client of the project is transactional",
    "enable.auto.commit": "the consumers commit (or not) themselves",
    "enable.auto.offset.store": "the consumers store their offsets themselves",
    "auto.offset.reset": "the metadata WAL's consumer must see a gap as an error",
    "isolation.level": "each consumer sets the isolation its reads need",
}


def _is_secret(name: str) -> bool:
    return name.endswith("password") or "secret" in name or name in {"ssl.key.pem", "sasl.oauthbearer.config"}


def _normalized(value: Any) -> dict[str, str | SecretStr]:
    """Property names lower-cased with ``_`` as ``.``, values as librdkafka's strings, secrets as SecretStr.
    A property given twice (``sasl.password`` in the file, ``TIERING_KAFKA_CLIENT__SASL_PASSWORD`` in the
    environment) takes the later value: the environment's. Errors name the property, never its value."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ValueError("must be a mapping of librdkafka properties, e.g. {security.protocol: SASL_SSL}")
    out: dict[str, str | SecretStr] = {}
    for given, raw in value.items():
        name = str(given).strip().lower().replace("_", ".")
        if not _NAME.fullmatch(name):
            raise ValueError(f"{given!r} is not a librdkafka property name (like security.protocol)")
        if name in _RESERVED:
            raise ValueError(f"{name} cannot be set here: {_RESERVED[name]}")
        if isinstance(raw, SecretStr):
            text = raw.get_secret_value()
        elif isinstance(raw, bool):
            text = "true" if raw else "false"
        elif isinstance(raw, str | int | float):
            text = str(raw)
        else:
            raise ValueError(f"{name} must be a string, number or boolean")
        out[name] = SecretStr(text) if _is_secret(name) else text
    return out


KafkaClientProperties = Annotated[dict[str, str | SecretStr], BeforeValidator(_normalized)]
"""The type of a ``kafka_client`` settings field (see the module's docstring)."""


def client_properties(properties: Mapping[str, str | SecretStr]) -> dict[str, str]:
    """The properties as librdkafka takes them, secrets revealed: only for building a client."""
    return {k: v.get_secret_value() if isinstance(v, SecretStr) else v for k, v in properties.items()}


def make_client(factory: Callable[[dict[str, Any]], C], config: dict[str, Any]) -> C:
    """``factory(config)``: a confluent-kafka Producer, Consumer or AdminClient.

    Raises ConfigError when librdkafka refuses a property or its value (an unknown name, an invalid
    ``security.protocol``, an unreadable ``ssl.ca.location``, SASL without credentials...): fix
    ``kafka_client`` (or ``TIERING_KAFKA_CLIENT__*``) as the message says.
    """
    try:
        return factory(config)
    except KafkaException as exc:
        error = exc.args[0]
        if not isinstance(error, KafkaError) or error.code() != KafkaError._INVALID_ARG:
            raise
        raise ConfigError(
            f"invalid Kafka client configuration (kafka_client, or TIERING_KAFKA_CLIENT__* variables): "
            f"{error.str()}; names and values are librdkafka's (see its CONFIGURATION.md)"
        ) from None
