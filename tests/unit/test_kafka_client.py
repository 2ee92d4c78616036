"""The ``kafka_client`` settings: librdkafka properties normalized, secrets hidden, a few keys refused, and
librdkafka's own refusal of a property turned into a clear ConfigError (real librdkafka, no broker needed)."""

from __future__ import annotations

import gc
import subprocess
import sys
import textwrap
import time
import weakref
from pathlib import Path

import pytest
import yaml
from confluent_kafka import Consumer, Producer
from pydantic import SecretStr

from reader import load_reader_settings
from tiering.config import load_settings
from tiering_core.errors import ConfigError
from tiering_core.kafka_client import client_properties, make_client
from tiering_core.kafka_logs import _POLL_SECONDS, admin_client

SECRET = "pl41n-s3cret"


def config_file(tmp_path: Path, kafka_client: object) -> Path:
    path = tmp_path / "sidecar.yaml"
    path.write_text(yaml.safe_dump({"bootstrap_servers": "127.0.0.1:9", "log_dirs": [str(tmp_path)],
                                    "kafka_client": kafka_client}))  # fmt: skip
    return path


def test_properties_are_normalized_and_secrets_never_shown(tmp_path: Path) -> None:
    path = config_file(tmp_path, {"security_protocol": "SASL_SSL", "SASL.Mechanism": "PLAIN", "sasl.username": "u",
                                  "sasl.password": SECRET, "enable.ssl.certificate.verification": False,
                                  "socket.timeout.ms": 5000, "ssl.ca.location": "/etc/ca.pem"})  # fmt: skip
    for settings in (load_settings(path), load_reader_settings(path)):
        assert isinstance(settings.kafka_client["sasl.password"], SecretStr)
        assert SECRET not in repr(settings) and SECRET not in str(settings.model_dump())
        assert client_properties(settings.kafka_client) == {
            "security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN", "sasl.username": "u", "sasl.password": SECRET,
            "enable.ssl.certificate.verification": "false", "socket.timeout.ms": "5000",
            "ssl.ca.location": "/etc/ca.pem",
        }  # fmt: skip


def test_environment_variables_add_and_override_properties(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = config_file(tmp_path, {"security.protocol": "SASL_PLAINTEXT", "sasl.password": "from-the-file"})
    monkeypatch.setenv("TIERING_KAFKA_CLIENT__SASL_PASSWORD", SECRET)
    monkeypatch.setenv("TIERING_KAFKA_CLIENT__SASL_USERNAME", "tiering")
    props = client_properties(load_settings(path).kafka_client)
    assert props == {"security.protocol": "SASL_PLAINTEXT", "sasl.password": SECRET, "sasl.username": "tiering"}
    monkeypatch.delenv("TIERING_KAFKA_CLIENT__SASL_PASSWORD")
    monkeypatch.delenv("TIERING_KAFKA_CLIENT__SASL_USERNAME")
    assert load_settings(config_file(tmp_path, None)).kafka_client == {}


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"bootstrap.servers": "x:1"}, "kafka_client: Value error, bootstrap.servers cannot be set here: set "
                                       "bootstrap_servers instead"),
        ({"acks": "1"}, "acks cannot be set here: the metadata WAL's producer needs acks=all"),
        ({"sasl password": SECRET}, "'sasl password' is not a librdkafka property name"),
        ({"sasl.password": {"nested": SECRET}}, "sasl.password must be a string, number or boolean"),
        (["security.protocol"], "must be a mapping of librdkafka properties"),
    ],
)  # fmt: skip
def test_a_wrong_property_is_a_config_error_naming_it_never_its_value(tmp_path: Path, given: object,
                                                                      message: str) -> None:  # fmt: skip
    with pytest.raises(ConfigError) as caught:
        load_settings(config_file(tmp_path, given))
    assert message in str(caught.value) and SECRET not in str(caught.value)


@pytest.mark.parametrize(
    ("props", "message"),
    [
        ({"sasl.usernam": "u"}, 'No such configuration property: "sasl.usernam"'),
        ({"security.protocol": "SASL_PLAINTEXTX"}, 'Invalid value "SASL_PLAINTEXTX" for configuration property'),
        ({"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN"}, "sasl.username and sasl.password must"),
    ],
)
def test_librdkafkas_refusal_names_kafka_client(props: dict[str, str], message: str) -> None:
    config = {"bootstrap.servers": "127.0.0.1:9", **props}
    for make in (lambda: make_client(Producer, config), lambda: make_client(Consumer, {**config, "group.id": "g"}),
                 lambda: admin_client(config)):  # fmt: skip
        with pytest.raises(ConfigError, match="invalid Kafka client configuration \\(kafka_client") as caught:
            make()
        assert message in str(caught.value)


def test_an_admin_client_its_owner_lets_go_is_freed_though_its_log_lines_were_polled() -> None:
    """The log poller holds admin clients weakly: one it has polled is freed once its owner drops it (it used to
    live, connecting and logging 'Connection refused', until the process ended)."""
    admin = admin_client({"bootstrap.servers": "127.0.0.1:9"})
    freed = weakref.ref(admin)
    time.sleep(3 * _POLL_SECONDS)  # the poller's thread polls it meanwhile
    del admin
    deadline = time.monotonic() + 10
    while freed() is not None and time.monotonic() < deadline:  # the poller may be polling it this very moment
        gc.collect()
        time.sleep(0.05)
    assert freed() is None, "the log poller keeps an admin client alive"


def test_an_admin_client_left_in_a_reference_cycle_is_not_destroyed_by_its_own_thread() -> None:
    """librdkafka completes an admin call on the client's background thread, where Python may collect
    garbage; a client found in a cycle then was destroyed there, and librdkafka aborted the process ("calling
    rd_kafka_destroy() from librdkafka owned thread is prohibited": a CI run of `tiering export` died so).
    Here every allocation collects, and each client is let go in a cycle while its call is in flight."""
    script = textwrap.dedent(
        """
        import gc, time, weakref
        from confluent_kafka import TopicCollection
        from tiering_core.kafka_logs import admin_client
        gc.set_threshold(1)
        freed = []
        for _ in range(3):
            admin = admin_client({"bootstrap.servers": "127.0.0.1:9"})
            freed.append(weakref.ref(admin))
            pending = admin.describe_topics(TopicCollection(["t"]), request_timeout=0.3)
            cycle = [admin, pending]
            cycle.append(cycle)
            del admin, pending, cycle
            time.sleep(0.8)  # the call fails on the client's thread, which collects the cycle
        time.sleep(1.0)
        print(sum(ref() is None for ref in freed))
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["3"], "the clients let go were not destroyed"
