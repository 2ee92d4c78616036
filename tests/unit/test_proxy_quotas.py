"""Client quotas in the access layer: Kafka's precedence of quota entities, its windowed rate and throttle
time, the throttled answer, the user a SASL login names, and the SCRAM exchange of the proxy's own login."""

from __future__ import annotations

import datetime

import pytest
from kio.schema.errors import ErrorCode
from kio.static.primitive import f64, i32, i64

from reader.proxy.admin import ScramClient
from reader.proxy.authentication import sasl_user
from reader.proxy.protocol import build, nested, response_type
from reader.proxy.quotas import DEFAULT, ClientQuotaManager, ClientQuotas, Rate, throttled

MB = 1_000_000
HANDSHAKE, AUTHENTICATE = 17, 36


def describe_answer(entries: list[tuple[dict[str, str | None], dict[str, float]]]) -> object:
    answer = response_type(48, 1)
    entry = nested(answer, "entries")
    entity, value = nested(entry, "entity"), nested(entry, "values")
    built = tuple(
        entry(entity=tuple(entity(entity_type=k, entity_name=v) for k, v in names.items()),
              values=tuple(value(key=k, value=f64(float(v))) for k, v in rates.items()))
        for names, rates in entries
    )  # fmt: skip
    return build(answer, throttle_time=datetime.timedelta(0), error_code=ErrorCode.none, error_message=None,
                 entries=built)  # fmt: skip


def test_quotas_are_read_from_the_describe_answer() -> None:
    quotas = ClientQuotas.from_answer(describe_answer([
        ({"client-id": "etl"}, {"consumer_byte_rate": 5 * MB, "producer_byte_rate": 1 * MB}),
        ({"user": None}, {"consumer_byte_rate": 2 * MB}),
        ({"user": "alice", "client-id": None}, {"consumer_byte_rate": 3 * MB}),
        ({"client-id": "writer"}, {"producer_byte_rate": 1 * MB}),
        ({"ip": "10.0.0.1"}, {"connection_creation_rate": 10}),
    ]))  # fmt: skip
    assert quotas.rates == {(None, "etl"): 5 * MB, (DEFAULT, None): 2 * MB, ("alice", DEFAULT): 3 * MB}


@pytest.mark.parametrize(
    ("rates", "user", "client_id", "tags", "limit"),
    [
        ({}, "alice", "etl", ("", "etl"), None),
        ({(None, "etl"): 5}, "alice", "etl", ("", "etl"), 5),
        ({(None, DEFAULT): 4}, None, "etl", ("", "etl"), 4),
        ({(None, "etl"): 5, (None, DEFAULT): 4}, "alice", "other", ("", "other"), 4),
        # a user's quota wins over a client id's, and is shared by all the user's client ids
        ({(None, "etl"): 5, ("alice", None): 3}, "alice", "etl", ("alice", ""), 3),
        ({(None, "etl"): 5, (DEFAULT, None): 2}, "alice", "etl", ("alice", ""), 2),
        ({("alice", "etl"): 1, ("alice", None): 3}, "alice", "etl", ("alice", "etl"), 1),
        ({("alice", DEFAULT): 6, ("alice", None): 3}, "alice", "etl", ("alice", "etl"), 6),
        ({(DEFAULT, "etl"): 7, ("alice", None): 3}, "alice", "etl", ("alice", ""), 3),
        ({(DEFAULT, "etl"): 7, (DEFAULT, None): 2}, "bob", "etl", ("bob", "etl"), 7),
        ({(DEFAULT, DEFAULT): 8, (None, "etl"): 5}, "bob", "etl", ("bob", "etl"), 8),
        # the user unknown (GSSAPI, OAUTHBEARER): only client-id quotas
        ({(DEFAULT, None): 2, (None, "etl"): 5}, None, "etl", ("", "etl"), 5),
        ({(DEFAULT, None): 2}, None, "etl", ("", "etl"), None),
    ],
)
def test_kafkas_precedence_of_quota_entities(rates: dict, user: str | None, client_id: str, tags: tuple[str, str],
                                             limit: float | None) -> None:  # fmt: skip
    quotas = ClientQuotas(rates)
    assert quotas.metric_tags(user, client_id) == tags
    assert quotas.limit(tags) == limit


def test_a_new_rate_counts_at_least_the_window_less_one_sample() -> None:
    rate = Rate(11, 1000)
    rate.record(10 * MB, 0)
    assert rate.window_size(0) == 10_000
    assert rate.measure(0) == 1 * MB
    assert rate.window_size(30_500) == 10_000  # every sample expired
    assert rate.measure(30_500) == 0


def greedy_reader(quota: float, answer: int, round_trip_ms: float, seconds: float) -> list[tuple[float, int]]:
    """A client fetching ``answer`` bytes per round trip whenever not throttled: (time ms, bytes) delivered."""
    manager = ClientQuotaManager(11, 1.0)
    manager.update(ClientQuotas({(None, "etl"): quota}))
    now, muted, got = 0.0, 0.0, []
    while now < seconds * 1000:
        if now >= muted:
            throttle = manager.record(1, None, "etl", answer, now / 1000)
            if throttle:
                muted = now + throttle
            else:
                got.append((now, answer))
        now += round_trip_ms
    return got


@pytest.mark.parametrize(("answer", "round_trip_ms"), [(1 << 20, 5), (1 << 20, 20), (256 << 10, 10), (1 << 20, 50)])
def test_a_greedy_reader_gets_its_quota_over_whole_windows(answer: int, round_trip_ms: float) -> None:
    got = greedy_reader(5 * MB, answer, round_trip_ms, 60)
    for seconds in (33, 44, 55):
        rate = sum(size for t, size in got if t < seconds * 1000) / seconds
        assert 0.9 * 5 * MB < rate <= 5 * MB


def test_a_reader_under_its_quota_is_not_throttled() -> None:
    got = greedy_reader(5 * MB, 100_000, 50, 30)  # 2 MB/s
    assert len(got) == 600


def test_no_quota_no_throttle_and_sensors_by_broker() -> None:
    manager = ClientQuotaManager(11, 1.0)
    assert manager.record(1, "alice", "etl", 1 << 30, 0.0) == 0
    assert manager.max_bytes("alice", "etl") is None
    manager.update(ClientQuotas({(None, "etl"): 1 * MB}))
    assert manager.max_bytes("alice", "etl") == 10 * MB
    assert manager.record(1, "alice", "etl", 10 * MB, 0.0) == 0
    assert manager.record(1, "alice", "etl", 1 * MB, 0.0) == 1000  # (11 - 10) / 10 x 10 s
    assert manager.record(2, "alice", "etl", 10 * MB, 0.0) == 0  # another broker's quota


def test_the_throttled_answer_is_empty_with_the_larger_throttle_time() -> None:
    answer = response_type(1, 12)
    topic = nested(answer, "responses")
    part = nested(topic, "partitions")
    data = build(part, partition_index=i32(0), error_code=ErrorCode.none, high_watermark=i64(1),
                 last_stable_offset=i64(1), log_start_offset=i64(0), aborted_transactions=None,
                 preferred_read_replica=i32(-1), records=b"x")  # fmt: skip
    body = build(answer, throttle_time=datetime.timedelta(milliseconds=300), error_code=ErrorCode.none,
                 session_id=i32(0), responses=(build(topic, topic="t", partitions=(data,)),))  # fmt: skip
    out = throttled(body, 120)
    assert out.responses == () and out.error_code == ErrorCode.none and out.session_id == 0
    assert out.throttle_time == datetime.timedelta(milliseconds=300)
    assert throttled(body, 900).throttle_time == datetime.timedelta(milliseconds=900)


def test_the_user_a_login_names() -> None:
    assert sasl_user("PLAIN", b"\0alice\0secret") == "alice"
    assert sasl_user("PLAIN", b"alice\0alice\0secret") == "alice"
    assert sasl_user("SCRAM-SHA-512", b"n,,n=al=2Cice=3D,r=abc") == "al,ice="
    assert sasl_user("SCRAM-SHA-256", b"n,,n=token1,r=abc,tokenauth=true") is None
    assert sasl_user("OAUTHBEARER", b"n,,\x01auth=Bearer x\x01\x01") is None
    assert sasl_user("PLAIN", b"garbage") is None


def test_scram_sha_256_exchange_of_rfc_7677() -> None:
    scram = ScramClient("SCRAM-SHA-256", "user", "pencil", nonce="rOprNGfwEbeRWgbNEkqO")
    assert scram.first() == b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO"
    server_first = b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
    assert scram.final(server_first) == (b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
                                         b"p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=")  # fmt: skip
    scram.verify(b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=")
