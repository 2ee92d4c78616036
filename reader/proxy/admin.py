"""The proxy's own requests to the brokers (DescribeClientQuotas), on a connection of its own.

librdkafka's admin client (confluent-kafka 2.16) has no DescribeClientQuotas, so the proxy sends it itself
with the ``kio`` schemas it reads clients' requests with, on a broker connection opened as the client
connections' are (``ProxyServer.open_upstream``: a bootstrap broker, ``kafka_client``'s TLS). On a SASL
listener it logs in with ``kafka_client``'s ``sasl.mechanism``, ``sasl.username`` and ``sasl.password``:
PLAIN, or SCRAM-SHA-256 / SCRAM-SHA-512 (RFC 5802, as Kafka's ``ScramSaslClient``), the mechanisms whose
client side is a password exchange. Another mechanism (GSSAPI, OAUTHBEARER) raises AdminError: the proxy
then has no requests of its own. Secrets are never logged nor put in an error.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import secrets
import struct
from typing import Any

from reader.proxy.frames import FrameProtocol
from reader.proxy.protocol import build, new_request, parse, request_type, response_body_start, response_type
from tiering_core.errors import TieringError

SASL_HANDSHAKE, SASL_AUTHENTICATE = 17, 36
CLIENT_ID = "tiering-proxy"
_SIZE = struct.Struct(">i")
_SCRAM = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}


class AdminError(TieringError):
    """The proxy's own request could not be made (login refused, a mechanism it cannot speak, no answer)."""


class AdminConnection:
    """One broker connection for the proxy's own requests, one at a time."""

    def __init__(self, protocol: FrameProtocol, timeout: float) -> None:
        self.protocol = protocol
        self.timeout = timeout
        self.correlation = 0

    def close(self) -> None:
        self.protocol.close()

    async def request(self, api_key: int, version: int, **fields: Any) -> Any:
        """The broker's parsed answer to one request built from ``fields``."""
        self.correlation += 1
        frame = new_request(
            api_key, version, self.correlation, CLIENT_ID, build(request_type(api_key, version), **fields)
        )
        try:
            async with asyncio.timeout(self.timeout):
                await self.protocol.write_frame(frame)
                answer = await self.protocol.next_frame()
        except TimeoutError:
            raise AdminError(f"no answer to API {api_key} within {self.timeout:.0f}s") from None
        except (ConnectionError, OSError) as exc:
            raise AdminError(f"the broker connection failed: {exc}") from exc
        if answer is None or _SIZE.unpack_from(answer, 0)[0] != self.correlation:
            raise AdminError(f"the broker closed the connection or answered another request (API {api_key})")
        return parse(response_type(api_key, version), answer, response_body_start(answer, api_key, version))

    async def login(self, props: dict[str, str]) -> None:
        """SASL with ``kafka_client``'s properties when its security.protocol is SASL_*; nothing otherwise."""
        if not props.get("security.protocol", "plaintext").lower().startswith("sasl"):
            return
        mechanism = props.get("sasl.mechanism", props.get("sasl.mechanisms", "GSSAPI")).upper()
        if mechanism != "PLAIN" and mechanism not in _SCRAM:
            raise AdminError(f"kafka_client's sasl.mechanism {mechanism} is not one the proxy logs in with for its "
                             "own requests (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512)")  # fmt: skip
        user, password = props.get("sasl.username", ""), props.get("sasl.password", "")
        shake = await self.request(SASL_HANDSHAKE, 1, mechanism=mechanism)
        if shake.error_code != 0:
            raise AdminError(f"the broker refused SASL mechanism {mechanism} ({shake.error_code.name})")
        if mechanism == "PLAIN":
            await self._authenticate(b"\0" + user.encode() + b"\0" + password.encode())
            return
        scram = ScramClient(mechanism, user, password)
        server_first = await self._authenticate(scram.first())
        scram.verify(await self._authenticate(scram.final(server_first)))

    async def _authenticate(self, token: bytes) -> bytes:
        answer = await self.request(SASL_AUTHENTICATE, 2, auth_bytes=token)
        if answer.error_code != 0:
            raise AdminError(f"the broker refused the proxy's login ({answer.error_code.name})")
        return bytes(answer.auth_bytes)


class ScramClient:
    """The client side of a SCRAM exchange (RFC 5802; Kafka sends no channel binding: ``n,,``)."""

    def __init__(self, mechanism: str, user: str, password: str, nonce: str | None = None) -> None:
        self.hash = _SCRAM[mechanism]
        self.password = password.encode()
        name = user.replace("=", "=3D").replace(",", "=2C")
        self.nonce = nonce or secrets.token_urlsafe(24)
        self.first_bare = f"n={name},r={self.nonce}"
        self.server_signature = b""

    def first(self) -> bytes:
        return f"n,,{self.first_bare}".encode()

    def final(self, server_first: bytes) -> bytes:
        fields = dict(item.split("=", 1) for item in server_first.decode().split(","))
        nonce, salt, iterations = fields["r"], base64.b64decode(fields["s"]), int(fields["i"])
        if not nonce.startswith(self.nonce):
            raise AdminError("the broker's SCRAM nonce does not extend the proxy's")
        salted = hashlib.pbkdf2_hmac(self.hash, self.password, salt, iterations)
        client_key = self._hmac(salted, b"Client Key")
        without_proof = f"c=biws,r={nonce}"
        message = f"{self.first_bare},{server_first.decode()},{without_proof}".encode()
        signature = self._hmac(hashlib.new(self.hash, client_key).digest(), message)
        proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
        self.server_signature = self._hmac(self._hmac(salted, b"Server Key"), message)
        return f"{without_proof},p={base64.b64encode(proof).decode()}".encode()

    def verify(self, server_final: bytes) -> None:
        fields = dict(item.split("=", 1) for item in server_final.decode().split(","))
        if "e" in fields or base64.b64decode(fields.get("v", "")) != self.server_signature:
            raise AdminError("the broker's SCRAM signature does not match: not the broker the proxy logged in to")

    def _hmac(self, key: bytes, message: bytes) -> bytes:
        return hmac.new(key, message, self.hash).digest()
