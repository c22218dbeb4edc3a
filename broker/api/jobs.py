"""Job routes: submit, submit many, list, get, cancel, explain (wait and logs, which last, are
in broker/api/waits.py).

A ``user`` token sees its own team's jobs only; any other job is a 404 like a missing one.
What each reply shows (secrets masked, other teams unnamed) is broker/api/views.py's.
"""

from __future__ import annotations

import math
import time
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Query, Request
from pydantic import BaseModel, ConfigDict, Field

from broker.api import auth
from broker.api.deps import ApiState, principal, state
from broker.api.views import scrubbed, seen, team_queue
from broker.client import parse_states
from broker.errors import FieldError, SpecError
from broker.model import JobSpec
from broker.security.tokens import TokenRecord

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])

Who = Annotated[TokenRecord, Depends(principal)]
JobId = Annotated[str, Path(pattern=r"^[A-Za-z0-9_.:-]{1,64}$", description="A job id")]
MAX_BATCH = 1000


class SubmitBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    spec: dict[str, Any] = Field(description="JobSpec fields (as in `spillway submit -f`); "
                                             "workdir must be absolute or left out")
    hold_if_infeasible: bool | None = None


class SubmitManyBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    specs: list[dict[str, Any]] = Field(max_length=MAX_BATCH)
    hold_if_infeasible: bool | None = None


def _checked(api: ApiState, who: TokenRecord, specs: list[dict[str, Any]],
             batch: bool) -> list[dict[str, Any]]:
    """Each spec charged to its team and parsed (SpecError naming every bad field, with the
    spec's place in a batch), before any submit is taken from the token's bucket."""
    out, problems = [], []
    for i, spec in enumerate(specs):
        at = f"[{i}]." if batch else ""
        try:
            out.append(_check_spec(who, spec, at))
            auth.class_allowed(who, JobSpec.parse(out[-1], api.client.config),
                               api.client.config, at)
        except SpecError as e:
            problems += [FieldError(f"{at}{p.field}" if not p.field.startswith(at) else p.field,
                                    p.problem, p.allowed) for p in e.errors]
    if problems:
        raise SpecError(problems)
    return out


def _check_spec(who: TokenRecord, spec: dict[str, Any], at: str = "") -> dict[str, Any]:
    """The spec charged to the token's team (a user's, when it names none), its workdir
    absolute: a relative one has no meaning on the server."""
    team = spec.get("team")
    if team is not None and not isinstance(team, str):
        raise SpecError([FieldError(f"{at}team", "must be a string")])
    workdir = spec.get("workdir")
    if isinstance(workdir, str) and workdir and not workdir.startswith(("/", "~")):
        raise SpecError([FieldError(f"{at}workdir", f"{workdir!r} is relative",
                                    "an absolute path, or none (the client makes it "
                                    "absolute against the directory it submits from)")])
    charged = auth.submit_team(who, team)
    return spec if charged == team else {**spec, "team": charged}


@router.post("", status_code=201, summary="Submit one job")
def submit(body: SubmitBody, who: Who, request: Request) -> dict[str, Any]:
    api = state(request)
    spec = _checked(api, who, [body.spec], batch=False)[0]
    api.tokens.take(who, 1, time.time(), api.submit_rate, api.submit_burst)
    job = api.client.acting_as(who.actor).submit(spec,
                                                  hold_if_infeasible=body.hold_if_infeasible)
    return job.to_dict()


@router.post("/batch", status_code=201, summary="Submit many jobs: all or none")
def submit_many(body: SubmitManyBody, who: Who, request: Request) -> list[dict[str, Any]]:
    api = state(request)
    specs = _checked(api, who, body.specs, batch=True)
    if specs:
        api.tokens.take(who, len(specs), time.time(), api.submit_rate, api.submit_burst)
    jobs = api.client.acting_as(who.actor).submit_many(
        specs, hold_if_infeasible=body.hold_if_infeasible)
    return [j.to_dict() for j in jobs]


@router.get("", summary="List jobs, oldest first")
def list_jobs(who: Who, request: Request,
              state_: Annotated[str | None, Query(alias="state", max_length=200,
                                                  description="Comma list of job states")] = None,
              team: Annotated[str | None, Query(max_length=64)] = None,
              priority: Annotated[str | None, Query(max_length=64)] = None,
              limit: Annotated[int | None, Query(ge=1, le=10_000)] = None,
              skip: Annotated[int, Query(ge=0)] = 0) -> list[dict[str, Any]]:
    team = auth.list_team(who, team)
    jobs = state(request).client.list(parse_states(state_), team=team, priority=priority,
                                      limit=limit, skip=skip)
    return scrubbed(request, who, [j.to_dict() for j in jobs if auth.sees(who, j)])


@router.get("/{job_id}", summary="One job's record")
def get(job_id: JobId, who: Who, request: Request) -> dict[str, Any]:
    return scrubbed(request, who, seen(request, who, job_id).to_dict())


@router.post("/{job_id}/cancel", summary="Cancel a job (a finished one is left as it is)")
def cancel(job_id: JobId, who: Who, request: Request) -> dict[str, Any]:
    job = seen(request, who, job_id)
    auth.require(who, "jobs.cancel", job.team)
    return scrubbed(request, who,
                    state(request).client.acting_as(who.actor).cancel(job_id).to_dict())


@router.get("/{job_id}/explain", summary="Why the job is where it is")
def explain(job_id: JobId, who: Who, request: Request) -> dict[str, Any]:
    job = seen(request, who, job_id)
    client = state(request).client
    out = client.explain(job_id).to_dict()
    if not math.isfinite(out["sla_s"]):
        out["sla_s"] = None  # (no SLA: JSON has no infinity)
    if who.role in auth.TEAM_SCOPED and out["pending_total"] is not None:
        out.update(team_queue(client.store, job))  # (its team's queue, not everyone's)
    return scrubbed(request, who, out)
