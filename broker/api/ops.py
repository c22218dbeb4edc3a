"""Operator and admin routes: nodes, drain and resume; tokens; who am I; health.

Budget and report routes (finance) go in their own module beside this one, as
``/v1/budgets`` and ``/v1/reports``, checked with ``auth.require(who, "budgets.read", team)``
(the actions are already in :data:`broker.api.auth.ALLOWED`).
"""

from __future__ import annotations

import time
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from broker.api import auth
from broker.api.deps import principal, state
from broker.security.tokens import TokenRecord

router = APIRouter()

Who = Annotated[TokenRecord, Depends(principal)]
NodeId = Annotated[str, Path(pattern=r"^[A-Za-z0-9_.:@-]{1,128}$", description="A node id")]
TokenId = Annotated[str, Path(pattern=r"^[0-9a-f]{12}$", description="A token id")]


@router.get("/healthz", tags=["ops"], summary="Liveness: the server and its Redis answer")
def healthz(request: Request) -> JSONResponse:
    state(request).client.store_redis.ping()
    return JSONResponse({"ok": True})


@router.get("/v1/whoami", tags=["tokens"], summary="The token's holder, role and teams")
def whoami(who: Who) -> dict[str, Any]:
    return who.to_dict(time.time())


@router.get("/v1/nodes", tags=["nodes"], summary="Every node with its GPUs and jobs")
def nodes(who: Who, request: Request) -> list[dict[str, Any]]:
    auth.require(who, "nodes.read")
    return [v.to_dict() for v in state(request).client.nodes()]


@router.post("/v1/nodes/{node_id}/drain", tags=["nodes"], summary="Place no new jobs there")
def drain(node_id: NodeId, who: Who, request: Request) -> dict[str, Any]:
    auth.require(who, "nodes.drain")
    return state(request).client.acting_as(who.actor).drain(node_id).to_dict()


@router.post("/v1/nodes/{node_id}/resume", tags=["nodes"], summary="Let it take jobs again")
def resume(node_id: NodeId, who: Who, request: Request) -> dict[str, Any]:
    auth.require(who, "nodes.drain")
    return state(request).client.acting_as(who.actor).resume(node_id).to_dict()


class TokenBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    user: str = Field(max_length=128)
    role: str = Field(max_length=16)
    teams: list[str] = Field(default=[], max_length=64)
    expires_s: float | None = Field(default=None, gt=0, le=10 * 365 * 86400)


@router.post("/v1/tokens", tags=["tokens"], status_code=201,
             summary="Create a token (shown once, in `token`)")
def create_token(body: TokenBody, who: Who, request: Request) -> dict[str, Any]:
    auth.require(who, "tokens")
    now = time.time()
    token, rec = state(request).tokens.create(body.user, body.role, body.teams, now,
                                              body.expires_s, by=who.actor)
    return {"token": token, "record": rec.to_dict(now)}


@router.get("/v1/tokens", tags=["tokens"], summary="Every token's record (no secrets)")
def list_tokens(who: Who, request: Request) -> list[dict[str, Any]]:
    auth.require(who, "tokens")
    now = time.time()
    return [r.to_dict(now) for r in state(request).tokens.list()]


@router.post("/v1/tokens/{token_id}/revoke", tags=["tokens"], summary="Revoke a token")
def revoke_token(token_id: TokenId, who: Who, request: Request) -> dict[str, Any]:
    auth.require(who, "tokens")
    now = time.time()
    return state(request).tokens.revoke(token_id, now, by=who.actor).to_dict(now)
