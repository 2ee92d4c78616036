"""When the proxy lifts Kafka's pre-authentication request limit: after the broker answered the SASL rounds
the mechanism has, or a request only an authenticated connection is answered."""

from __future__ import annotations

import datetime

import pytest
from kio.schema.errors import ErrorCode

from reader.proxy.authentication import ANONYMOUS, Authentication
from reader.proxy.protocol import build, new_request, request_type, response_frame, response_type

HANDSHAKE, AUTHENTICATE, METADATA = 17, 36, 3


def frame(api_key: int, version: int, **fields: object) -> bytes:
    return new_request(api_key, version, 1, "c", build(request_type(api_key, version), **fields))


def handshake(mechanism: str) -> bytes:
    return frame(HANDSHAKE, 1, mechanism=mechanism)


def authenticated(error: int) -> bytearray:
    body = build(response_type(AUTHENTICATE, 2), error_code=ErrorCode(error), error_message=None, auth_bytes=b"",
                 session_lifetime=datetime.timedelta(0))  # fmt: skip
    return bytearray(bytes(response_frame(2, AUTHENTICATE, 2, body))[4:])


@pytest.mark.parametrize(("mechanism", "rounds"), [("PLAIN", 1), ("SCRAM-SHA-512", 2), ("scram-sha-256", 2)])
def test_done_after_the_mechanisms_rounds(mechanism: str, rounds: int) -> None:
    auth = Authentication(sasl_listener=True)
    auth.request(HANDSHAKE, 1, handshake(mechanism))
    auth.answered(HANDSHAKE, 1, bytearray())
    for _ in range(rounds - 1):
        auth.answered(AUTHENTICATE, 2, authenticated(0))
        assert not auth.done
    auth.answered(AUTHENTICATE, 2, authenticated(0))
    assert auth.done


def test_a_failed_round_or_an_unknown_mechanism_is_not_done_until_the_broker_answers_a_request() -> None:
    auth = Authentication(sasl_listener=True)
    auth.request(HANDSHAKE, 1, handshake("PLAIN"))
    auth.answered(AUTHENTICATE, 2, authenticated(58))  # SASL_AUTHENTICATION_FAILED
    assert not auth.done
    gssapi = Authentication(sasl_listener=True)
    gssapi.request(HANDSHAKE, 1, handshake("GSSAPI"))
    for _ in range(3):
        gssapi.answered(AUTHENTICATE, 2, authenticated(0))
    assert not gssapi.done
    gssapi.answered(METADATA, 12, bytearray())
    assert gssapi.done


def test_no_sasl_listener_has_nothing_to_wait_for() -> None:
    assert Authentication(sasl_listener=False).done


def test_the_user_is_taken_once_the_broker_accepted_the_login() -> None:
    assert Authentication(sasl_listener=False).user == ANONYMOUS
    assert Authentication(sasl_listener=False, certificate=True).user is None
    auth = Authentication(sasl_listener=True)
    auth.request(HANDSHAKE, 1, frame(HANDSHAKE, 1, mechanism="PLAIN"))
    auth.request(AUTHENTICATE, 2, frame(AUTHENTICATE, 2, auth_bytes=b"\0mallory\0wrong"))
    auth.answered(AUTHENTICATE, 2, authenticated(58))  # SASL_AUTHENTICATION_FAILED
    assert auth.user is None
    auth.request(AUTHENTICATE, 2, frame(AUTHENTICATE, 2, auth_bytes=b"\0alice\0secret"))
    auth.answered(AUTHENTICATE, 2, authenticated(0))
    assert auth.done and auth.user == "alice"
