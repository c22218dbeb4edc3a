"""The ASGI app: the FastAPI application, its errors as JSON, and the token check.

Every route is a thin shell over :class:`broker.client.Client` on the cluster's Redis, acting
for the token's holder (who is then named in the job history). Errors are one JSON shape,
never a traceback::

    {"error": "one line saying what was wrong and what to do", "errors": [{"field": ...,
     "problem": ..., "allowed": ...}]}

with 401 (token), 403 (role or team: the message names the one needed), 404 (no such job, or
one of a team the token may not see), 409, 413 (body too large), 422 (bad input, each field
named), 429 (submit rate, or too many open long polls, with Retry-After), 503 (Redis
unreachable). Every reply's spec secrets are masked as the CLI masks them.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import redis
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from broker.api import budgets, jobs, ops, reports, waits
from broker.api.deps import ApiState
from broker.api.longpoll import DEFAULT_LONG_POLLS, LongPolls, OpenPolls, long_polls_from
from broker.api.views import MaskedJSON
from broker.client import Client
from broker.config.core import Config, load_config
from broker.errors import (
    ConfigError,
    Conflict,
    FieldError,
    JobNotFound,
    NodeNotFound,
    SpecError,
    SpillwayError,
    StoreUnreachable,
)
from broker.security.tokens import RateLimited, Refused, TokenError, TokenStore

log = logging.getLogger("spillway.api")

MAX_BODY = 1 << 20  # bytes; a batch of a thousand specs fits well within it
API_VERSION = "1"


def _body(message: str, errors: list[FieldError] | tuple[FieldError, ...] = ()) -> dict[str, Any]:
    return {"error": message, "errors": [e.to_dict() for e in errors]}


def _reply(status: int, message: str, errors: Any = (), **headers: str) -> JSONResponse:
    return JSONResponse(_body(message, errors), status_code=status, headers=headers or None)


def _field(loc: tuple[Any, ...]) -> str:
    """A pydantic location as a field name: ("body", "spec", "gpus") -> "spec.gpus"."""
    parts = [str(p) for p in loc if p not in ("body", "query", "path", "header")]
    out = ""
    for p in parts:
        out += f"[{p}]" if p.isdigit() else (f".{p}" if out else p)
    return out or "body"


def _invalid(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    errors = []
    for e in exc.errors():
        msg = str(e.get("msg", "is not valid"))
        if e.get("type") == "extra_forbidden":
            msg = "is not a known field"
        elif e.get("type") == "json_invalid":
            msg = f"is not valid JSON ({e.get('ctx', {}).get('error', msg)})"
        errors.append(FieldError(_field(tuple(e.get("loc", ()))), msg))
    return _reply(422, f"invalid request ({len(errors)} problem(s)): "
                       + "; ".join(str(x) for x in errors), errors)


def _spillway(_: Request, exc: Exception) -> JSONResponse:
    if isinstance(exc, SpecError):
        return _reply(422, str(exc), exc.errors)
    if isinstance(exc, TokenError):
        return _reply(401, str(exc), **{"WWW-Authenticate": "Bearer"})
    if isinstance(exc, Refused):
        return _reply(403, str(exc))
    if isinstance(exc, (JobNotFound, NodeNotFound, *budgets.NOT_FOUND)):
        return _reply(404, str(exc))
    if isinstance(exc, RateLimited):
        # no Retry-After where waiting would not help (a batch over the burst: split it)
        return _reply(429, str(exc), **({"Retry-After": str(max(1, round(exc.retry_after)))}
                                        if exc.retry_after > 0 else {}))
    if isinstance(exc, Conflict):
        return _reply(409, str(exc))
    if isinstance(exc, StoreUnreachable):
        return _reply(503, "the API server cannot reach its Redis; try again shortly")
    return _reply(400, str(exc))


def _http(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, HTTPException)
    words = {404: "no such route; /openapi.json lists them",
             405: "this route does not take that method; /openapi.json lists what it takes"}
    return _reply(exc.status_code, words.get(exc.status_code, str(exc.detail)),
                  **(exc.headers or {}))


def _store_down(_: Request, exc: Exception) -> JSONResponse:
    log.warning("Redis error: %s", type(exc).__name__)
    return _reply(503, "the API server cannot reach its Redis; try again shortly")


def _crash(_: Request, exc: Exception) -> JSONResponse:
    log.exception("internal error")
    return _reply(500, f"internal error ({type(exc).__name__}); the server's log has the "
                       "details")


Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


class BodyLimit:
    """Refuse a request whose body is larger than ``limit`` bytes (413), declared or not: a
    body without a Content-Length (chunked) is read up to the limit before the app sees it,
    and replayed to it whole."""

    def __init__(self, app: Any, limit: int = MAX_BODY) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope: MutableMapping[str, Any], receive: Receive,
                       send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or ()).get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.limit):
            await self._refuse(scope, receive, send)
            return
        chunks, seen, more = [], 0, True
        while more:
            msg = await receive()
            if msg["type"] != "http.request":  # (the client went away before its body)
                return
            chunks.append(msg.get("body", b""))
            seen += len(chunks[-1])
            if seen > self.limit:
                await self._refuse(scope, receive, send)
                return
            more = bool(msg.get("more_body", False))
        whole: MutableMapping[str, Any] | None = {"type": "http.request",
                                                  "body": b"".join(chunks), "more_body": False}

        async def replayed() -> MutableMapping[str, Any]:
            nonlocal whole
            if whole is not None:
                msg, whole = whole, None
                return msg
            return await receive()  # (a disconnect, for the routes that wait)

        await self.app(scope, replayed, send)

    async def _refuse(self, scope: MutableMapping[str, Any], receive: Receive,
                      send: Send) -> None:
        await _reply(413, f"request body too large: at most {self.limit} bytes (submit "
                          "large batches in parts)")(scope, receive, send)


def create_app(client: Client, submit_rate: float = 50.0, submit_burst: int = 5000,
               long_polls: int = DEFAULT_LONG_POLLS) -> FastAPI:
    """The API on ``client``'s cluster (a client on a ``redis://`` URL); a token holds at
    most ``long_polls`` waits and log follows open at once."""
    if client._remote is not None:
        raise ConfigError(f"the API server needs the cluster's Redis URL, not {client.redis_url}")
    if submit_rate <= 0 or submit_burst < 1:
        raise ConfigError("submit_rate must be positive and submit_burst at least 1")
    polls = LongPolls(OpenPolls(client.store_redis, long_polls), client.store.get_many)
    # every reply's spec secrets masked as the CLI masks them (broker/api/views.py)
    app = FastAPI(title="Spillway API", version=API_VERSION, docs_url=None, redoc_url=None,
                  openapi_url="/openapi.json", default_response_class=MaskedJSON,
                  description="Submit, watch and cancel GPU jobs; operate nodes; manage tokens;"
                              " set budgets and read spend reports."
                              " Every call but /healthz needs `Authorization: Bearer <token>`.")
    app.state.api = ApiState(client, TokenStore(client.store_redis), submit_rate, submit_burst,
                             polls)
    app.add_exception_handler(RequestValidationError, _invalid)
    app.add_exception_handler(SpillwayError, _spillway)
    app.add_exception_handler(HTTPException, _http)
    app.add_exception_handler(redis.RedisError, _store_down)
    app.add_exception_handler(Exception, _crash)
    app.add_middleware(BodyLimit)
    app.include_router(jobs.router)
    app.include_router(waits.router)
    app.include_router(ops.router)
    app.include_router(budgets.router)
    app.include_router(reports.router)
    return app


def from_env() -> FastAPI:
    """The app uvicorn builds in each worker process (``spillway api`` sets the variables)."""
    config: Config = load_config(os.environ.get("SPILLWAY_CONFIG") or None)
    client = Client(os.environ["SPILLWAY_REDIS_URL"], config)
    return create_app(client, float(os.environ.get("SPILLWAY_API_SUBMIT_RATE", "50")),
                      int(os.environ.get("SPILLWAY_API_SUBMIT_BURST", "5000")),
                      long_polls_from(os.environ))

