"""What a token is shown of jobs.

* Every reply's spec secrets are masked by the CLI's own rule
  (:func:`broker.security.redact.masked`: secret-named ``env`` values and URL passwords), for
  every role: :class:`MaskedJSON` is the app's response class, so no route can forget it.
* A ``user`` (or ``finance``) token never reads another team's job ids, nor the class and
  team of the job that preempted its own (:func:`scrubbed`), and the queue it is told about
  counts its team's jobs only (:func:`team_queue`).
* A job of a team the token may not see is missing (:func:`seen`).
"""

from __future__ import annotations

import json
import re
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse

from broker.api import auth
from broker.api.deps import state
from broker.model import Job
from broker.security.redact import masked
from broker.security.tokens import TokenRecord
from broker.store.base import BaseStore

HIDDEN = "a job of another team"
_JOB_ID = re.compile(r"\bj-[0-9a-f]{12}\b")
#: a job id, and the parenthesis that may follow it naming that job's class or team (a
#: preemption's reason: ``preempted by j-... (critical, team nlp)``)
_JOB_AND_WHO = re.compile(r"\b(?P<id>j-[0-9a-f]{12})\b(?P<who> \((?=[^()\"]*\bteam\b)"
                          r"[^()\"]*\))?")


class MaskedJSON(JSONResponse):
    """A JSON reply with every spec's secrets masked as the CLI masks them."""

    def render(self, content: Any) -> bytes:
        return super().render(masked(content))


def scrubbed(request: Request, who: TokenRecord, doc: Any) -> Any:
    """``doc`` with the ids of jobs ``who`` may not see replaced by words, and what names
    their class or team dropped: a job's history and reasons name the jobs that preempted it
    or hold a reservation ahead of it, maybe another team's (whose ids, class and team must
    not leak)."""
    if who.role not in auth.TEAM_SCOPED:
        return doc
    text = json.dumps(doc)
    ids = sorted(set(_JOB_ID.findall(text)))
    if not ids:
        return doc
    jobs = state(request).client.store.get_many(ids)
    return unnamed(doc, {i for i, j in zip(ids, jobs) if j is None or not auth.sees(who, j)})


def unnamed(doc: Any, hidden: set[str]) -> Any:
    """``doc`` with each of the ``hidden`` job ids, and the parenthesis after it that names
    that job's team (and class), replaced by :data:`HIDDEN`."""
    if not hidden:
        return doc
    return json.loads(_JOB_AND_WHO.sub(
        lambda m: HIDDEN if m.group("id") in hidden else m.group(0), json.dumps(doc)))


def seen(request: Request, who: TokenRecord, job_id: str) -> Job:
    """The job, if the token may read jobs and see this one; 404 as if missing otherwise."""
    auth.require(who, "jobs.read")
    return auth.visible(who, state(request).client.get(job_id))


def team_queue(store: BaseStore, job: Job) -> dict[str, int | None]:
    """``position`` and ``pending_total`` as a team-bound token is shown them: the job's
    place among its own team's pending jobs, and how many those are, in the order the last
    cycle ranked the queue (other teams' jobs are not counted: their number does not leak).
    Both None when no cycle ranked the queue."""
    order = store.last_order()
    if order is None:
        return {"position": None, "pending_total": None}
    ids = list(order.ids)
    mine = [i for i, j in zip(ids, store.get_many(ids)) if j is not None and j.team == job.team]
    return {"position": mine.index(job.id) + 1 if job.id in mine else None,
            "pending_total": len(mine)}
