"""A tiered topic deleted and created again under its name is another topic (KIP-516's topic ids): every
reader that served the deleted topic's remote copies serves the new topic's records, and only those, without
a restart. The access layer (by name, Fetch v12; by id, librdkafka and Kafka's Java console consumer), the
HTTP fetch service and the TieredConsumer each read the old topic first, so every cache holds it."""

from __future__ import annotations

import base64
import contextlib
import time
import uuid
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kafka.record.memory_records import MemoryRecords

from deploy.stack import Endpoints
from reader import RemoteReader, TieredConsumer
from reader.errors import NotInRemote
from reader.http.service import FetchService
from tests.kafka_wire import RawKafka, partition_errors, record_bytes
from tests.proxy_harness import check_exact, console_consume, proxy_bootstrap, proxy_for, read_all
from tests.reader_harness import expected, tiered_topic
from tests.sidecar_harness import wait_for
from tiering_core.kafka_cluster import KafkaCluster

pytestmark = pytest.mark.integration

NEW = {o: (f"k{o}".encode(), f"new-{o}".encode(), []) for o in range(10)}
UNKNOWN_TOPIC_ID = 100


def as_record(m: Any) -> tuple:
    return (m.key(), m.value(), list(m.headers() or []))


def topic_uuid(bootstrap: str, topic: str) -> uuid.UUID:
    with KafkaCluster(bootstrap) as cluster:
        kafka_id = cluster.topics([topic])[topic].topic_id
    return uuid.UUID(bytes=base64.urlsafe_b64decode(kafka_id + "=="))


def create_again(bootstrap: str, topic: str) -> None:
    """Delete the topic, create it again under its name and produce the 10 records of ``NEW``."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.delete_topics([topic])[topic].result(60)
    wait_for(lambda: topic not in admin.list_topics(timeout=10).topics, 60, f"{topic} to be gone")

    errors: list[str] = []

    def created() -> bool:
        try:
            admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(60)
        except KafkaException as exc:  # the deletion is still being finished on the broker
            errors.append(str(exc))
            return (
                exc.args[0].code() == KafkaError.TOPIC_ALREADY_EXISTS and topic in admin.list_topics(timeout=10).topics
            )
        return True

    try:
        wait_for(created, 60, f"{topic} to be created again")
    except AssertionError as exc:
        raise AssertionError(f"{exc}: {errors[-3:]}") from None
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for key, value, _ in NEW.values():
        producer.produce(topic, value, key, partition=0)
    assert producer.flush(30) == 0


def raw_records(answer: Any) -> list[tuple[int, tuple]]:
    """(offset, (key, value, headers)) of the record batches in a Fetch answer, decoded by kafka-python."""
    out = []
    for t in answer.responses:
        for p in t.partitions:
            records = MemoryRecords(bytes(p.records or b""))
            while (batch := records.next_batch()) is not None:
                out.extend((r.offset, (r.key, r.value, list(r.headers))) for r in batch)
    return out


def fetch_v12_from_zero(bootstrap: str, topic: str) -> list[tuple[int, tuple]]:
    """Fetch v12 (by name) of partition 0 from offset 0 until records come (an answer may leave the partition
    out, as Kafka's broker may: the client asks again)."""
    with RawKafka(bootstrap) as raw:
        for _ in range(20):
            answer = raw.fetch(12, topic, uuid.UUID(int=0), 0, 0)
            assert answer is not None and answer.error_code == 0
            got = raw_records(answer)
            if got:
                return got
            time.sleep(0.2)
    raise AssertionError("no records by Fetch v12 from offset 0")


def test_a_deleted_and_created_again_topic_is_read_as_the_new_topic(stack: Endpoints, tmp_path: Any) -> None:
    with tiered_topic(stack, tmp_path, records=6_000, local_retention=64 * 1024) as t:
        topic, old_produced = t.topic, expected(t.produced, read_committed=False)
        old_id = topic_uuid(stack.bootstrap, topic)
        service = FetchService(RemoteReader.open(t.reader_settings()), cursors=16, memory_wait=5.0)
        with (
            contextlib.closing(service),
            proxy_for(t.config, stack.bootstrap) as proxy,
            TieredConsumer(
                {
                    "bootstrap.servers": stack.bootstrap,
                    "group.id": f"g-{uuid.uuid4().hex[:6]}",
                    "enable.auto.commit": False,
                },
                t.reader_settings(),
            ) as consumer,  # fmt: skip
        ):
            bootstrap = proxy_bootstrap(proxy)
            # the old topic through every reader: their caches know it
            end = t.end_offset(0)
            got = read_all(bootstrap, topic, {0: end}, **{"isolation.level": "read_uncommitted"})[0]
            check_exact([(m.offset(), as_record(m)) for m in got], old_produced)
            old_by_name = fetch_v12_from_zero(bootstrap, topic)
            assert old_by_name[0][0] == 0 and old_by_name[0][1][1] == old_produced[0][1]
            page = service.fetch(topic, 0, 0, 64 * 1024, "read_uncommitted")
            assert page.offset == 0 and page.data
            consumer.assign([TopicPartition(topic, 0, 0)])
            assert consumer.consume(10, 30)[0].value() == old_produced[0][1]
            consumer.unassign()

            create_again(stack.bootstrap, topic)
            new_id = topic_uuid(stack.bootstrap, topic)
            assert new_id != old_id

            # by name first, before any Metadata answer with the new id passes through the proxy
            check_exact(fetch_v12_from_zero(bootstrap, topic), NEW)
            with RawKafka(bootstrap) as raw:
                answer = raw.fetch(13, topic, old_id, 0, 0)
                assert answer is not None and partition_errors(answer) == [UNKNOWN_TOPIC_ID]
                assert record_bytes(answer) == 0
            got = read_all(bootstrap, topic, {0: 10}, **{"isolation.level": "read_uncommitted"})[0]
            check_exact([(m.offset(), as_record(m)) for m in got], NEW)
            lines = console_consume(bootstrap, topic, 10)
            check_exact([(o, (k, v)) for _, o, k, v in lines], {o: (k, v) for o, (k, v, _) in NEW.items()})

            with pytest.raises(NotInRemote):  # nothing of the new topic is remote: the broker serves it
                service.fetch(topic, 0, 0, 64 * 1024, "read_uncommitted")
            assert service.offsets(topic, 0).remote_start is None

            consumer.assign([TopicPartition(topic, 0, 0)])
            messages: list[Any] = []
            deadline = time.monotonic() + 60
            while len(messages) < 10 and time.monotonic() < deadline:
                messages.extend(m for m in consumer.consume(10, 1.0) if m.error() is None)
            check_exact([(m.offset(), as_record(m)) for m in messages], NEW)
