"""What every route depends on: the shared state, and the token check."""

from __future__ import annotations

import time
from dataclasses import dataclass

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from broker.api.longpoll import LongPolls
from broker.client import Client
from broker.security.tokens import TokenError, TokenRecord, TokenStore


@dataclass
class ApiState:
    """What every request shares: the client on Redis, the tokens, the submit limits, the
    long polls (waits and log follows, capped per token)."""

    client: Client
    tokens: TokenStore
    submit_rate: float  # jobs a second, per token
    submit_burst: int  # jobs at once, per token
    polls: LongPolls


def state(request: Request) -> ApiState:
    return request.app.state.api  # type: ignore[no-any-return]


_bearer = HTTPBearer(auto_error=False, description="A token from `spillway token create`")


def principal(request: Request,
              creds: HTTPAuthorizationCredentials | None = Depends(_bearer)) -> TokenRecord:
    """The token's record; TokenError (401) when there is none or it is not valid."""
    if creds is None or creds.scheme.lower() != "bearer" or not creds.credentials:
        raise TokenError("no token: send `Authorization: Bearer <token>` (the CLI reads "
                         "SPILLWAY_TOKEN or SPILLWAY_TOKEN_FILE)")
    return state(request).tokens.verify(creds.credentials, time.time())
