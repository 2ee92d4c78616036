"""Bearer-token authentication of the record endpoints.

Tokens come from the configuration (``http.tokens``, SecretStr: never logged or echoed). A presented
token is compared with every configured one in constant time (``hmac.compare_digest``), and all of
them are compared, so the answer's timing tells nothing about which token or how much of it matched.
"""

from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import Depends, HTTPException
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import SecretStr

_scheme = HTTPBearer(auto_error=False, description="One of the tokens in the service's http.tokens setting.")


class BearerAuth:
    """A FastAPI dependency: 401 (with ``WWW-Authenticate: Bearer``) unless a configured token is presented."""

    def __init__(self, tokens: list[SecretStr]) -> None:
        self._tokens = [t.get_secret_value().encode() for t in tokens]

    def accepts(self, presented: str) -> bool:
        given = presented.encode()
        ok = False
        for token in self._tokens:
            ok |= hmac.compare_digest(given, token)
        return ok

    def __call__(self, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_scheme)]) -> None:
        if credentials is None:
            raise HTTPException(401, "missing bearer token: send 'Authorization: Bearer <token>'",
                                headers={"WWW-Authenticate": "Bearer"})  # fmt: skip
        if not self.accepts(credentials.credentials):
            raise HTTPException(401, "the bearer token is not accepted",
                                headers={"WWW-Authenticate": 'Bearer error="invalid_token"'})  # fmt: skip
