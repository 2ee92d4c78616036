"""Whether a client connection has authenticated to the broker, for Kafka's pre-authentication size limit.

Kafka's broker reads at most ``sasl.server.max.receive.size`` (512 KiB by default) per request from a
connection on a SASL listener until its SASL exchange is complete (``SaslServerAuthenticator``), so that a
peer that has not logged in cannot make it hold ``socket.request.max.bytes`` (100 MiB) per connection. The
proxy reads a client's whole request before the broker sees it, so it applies the same bound until the
connection is authenticated, which it learns from the exchange it forwards: the SaslHandshake request
names the mechanism, and the connection is authenticated once the broker has answered as many
SaslAuthenticate rounds without error as the mechanism has (PLAIN and OAUTHBEARER one, SCRAM two), or
answered any request other than ApiVersions and the SASL ones (the broker answers nothing else before
authentication is complete; GSSAPI's rounds vary). On a listener without SASL (PLAINTEXT, SSL) there is
nothing to wait for, as on the broker. Once authenticated a connection stays so: KIP-368's
re-authentication keeps the principal, and the broker enforces it.

The same exchange tells the proxy the principal's name, for the user quotas (``reader.proxy.quotas``),
where the mechanism shows it: PLAIN's token is ``authzid NUL username NUL password`` (Kafka's principal is
the username), SCRAM's client-first message names ``n=<username>`` (unless it logs in with a delegation
token, ``tokenauth=true``: the principal is then the token's owner, which the proxy cannot see). GSSAPI and
OAUTHBEARER name the principal inside tickets and tokens the broker maps: the user stays unknown (None).
Without SASL the principal is ANONYMOUS, unless the broker sees the proxy's own client certificate. The
user is taken once the broker accepted the login; a password is never kept.
"""

from __future__ import annotations

import math

from reader.proxy.protocol import parse, read_request_head, request_type, response_body_start, response_type

SASL_HANDSHAKE, SASL_AUTHENTICATE, API_VERSIONS = 17, 36, 18
_ROUNDS = {"PLAIN": 1, "OAUTHBEARER": 1, "SCRAM-SHA-256": 2, "SCRAM-SHA-512": 2}
ANONYMOUS = "ANONYMOUS"  # Kafka's principal of a connection without SASL or a client certificate


class Authentication:
    """One client connection's SASL progress as the broker answered it (its own task's state, no lock)."""

    def __init__(self, sasl_listener: bool, certificate: bool = False) -> None:
        self.done = not sasl_listener
        self.mechanism = ""
        self.rounds = 0
        self.user: str | None = None if sasl_listener or certificate else ANONYMOUS  # None: not known
        self.pending: str | None = None  # the user the login names, until the broker accepts it

    def request(self, api_key: int, version: int, frame: bytes) -> None:
        """A request on its way to the broker (the SaslHandshake names the mechanism)."""
        if not self.done and api_key == SASL_HANDSHAKE:
            body = parse(request_type(api_key, version), frame, read_request_head(frame).body)
            self.mechanism = str(body.mechanism).upper()
        elif not self.done and api_key == SASL_AUTHENTICATE and self.rounds == 0:
            body = parse(request_type(api_key, version), frame, read_request_head(frame).body)
            self.pending = sasl_user(self.mechanism, bytes(body.auth_bytes))

    def answered(self, api_key: int, version: int, answer: memoryview) -> None:
        """The broker's answer to a request of ``api_key``."""
        if self.done:
            return
        if api_key == SASL_AUTHENTICATE:
            body = parse(response_type(api_key, version), answer, response_body_start(answer, api_key, version))
            if body.error_code == 0:
                self.rounds += 1
                self.done = self.rounds >= _ROUNDS.get(self.mechanism, math.inf)
                if self.done:
                    self.user = self.pending
        elif api_key not in (SASL_HANDSHAKE, API_VERSIONS):
            self.done = True


def sasl_user(mechanism: str, token: bytes) -> str | None:
    """The username a client's first SASL token names (PLAIN, SCRAM), None for other mechanisms, a
    delegation token or a token that does not parse."""
    try:
        if mechanism == "PLAIN":
            _authzid, user, _password = token.split(b"\0", 2)
            return user.decode()
        if mechanism.startswith("SCRAM-"):
            _gs2, _authzid, bare = token.decode().split(",", 2)
            fields = dict(item.split("=", 1) for item in bare.split(",") if "=" in item)
            if fields.get("tokenauth", "").lower() == "true":
                return None
            return fields["n"].replace("=2C", ",").replace("=3D", "=")
    except (ValueError, KeyError, UnicodeDecodeError):
        return None
    return None
