"""The job routes that last: ``wait`` (until the job ends, at most 60 s a call) and ``logs``
(streamed while the job runs with ``follow``).

Both are asynchronous: while they wait they hold no worker thread (broker/api/longpoll.py),
so one token's waits cannot starve another's calls. A token holds at most the server's
cap of them open at once (``SPILLWAY_API_LONG_POLLS``, default 8); past it, 429 with
``Retry-After``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Query, Request
from fastapi.responses import StreamingResponse

from broker.api.deps import ApiState, principal, state
from broker.api.longpoll import FOLLOW_HOLD_S, HOLD_SLACK_S
from broker.api.views import scrubbed, seen
from broker.errors import FieldError, SpecError
from broker.model.state import TERMINAL
from broker.security.tokens import TokenRecord
from broker.store.backend import LogLine

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])

Who = Annotated[TokenRecord, Depends(principal)]
JobId = Annotated[str, Path(pattern=r"^[A-Za-z0-9_.:-]{1,64}$", description="A job id")]
WAIT_MAX_S = 60.0
LOG_TICK_S = 0.25  # a follower reads new lines this often while none come
LOG_BATCH = 1000  # lines a read
RENEW_EVERY_S = FOLLOW_HOLD_S / 3


@router.get("/{job_id}/wait", summary="Wait (up to 60 s a call) for the job to end")
async def wait(job_id: JobId, who: Who, request: Request,
               timeout: Annotated[float, Query(ge=0, le=WAIT_MAX_S)] = 30.0
               ) -> dict[str, Any]:
    """``done`` is false when the job had not ended by ``timeout``: call again. Counts as
    one of the token's open long polls while it waits."""
    api = state(request)
    polls = api.polls
    job = await polls.run(seen, request, who, job_id)
    if job.state not in TERMINAL and timeout > 0:
        async with polls.held(who, timeout + HOLD_SLACK_S):
            await polls.until_ended(job_id, timeout, request.is_disconnected)
        job = await polls.run(api.client.get, job_id)
    return {"done": job.state in TERMINAL,
            "job": await polls.run(scrubbed, request, who, job.to_dict())}


@router.get("/{job_id}/logs", summary="An attempt's output, as JSON lines (streamed)",
            response_class=StreamingResponse,
            responses={200: {"content": {"application/x-ndjson": {}},
                             "description": "One JSON object a line: cursor, time, stream "
                                            "(out or err), text"}})
async def logs(job_id: JobId, who: Who, request: Request,
               attempt: Annotated[int | None, Query(ge=1)] = None,
               follow: bool = False,
               since: Annotated[str, Query(max_length=64, pattern=r"^[0-9-]+$")] = "0"
               ) -> StreamingResponse:
    """With ``follow``, the stream stays open until the job ends or moves to a later
    attempt, and counts as one of the token's open long polls."""
    api = state(request)
    job = await api.polls.run(seen, request, who, job_id)
    if attempt is not None and attempt > job.attempt:
        raise SpecError([FieldError("attempt", f"job {job_id} has had {job.attempt} "
                                               f"attempt(s)", f"1 to {job.attempt}")])
    number = job.attempt if attempt is None else attempt
    if not follow:
        return StreamingResponse(_lines(api, job_id, number, since, None),
                                 media_type="application/x-ndjson")
    hold = api.polls.held(who, FOLLOW_HOLD_S)
    renew = await hold.__aenter__()  # (429 here, before the reply starts; a stream that never
    #                                  starts gives its hold back when the hold runs out)

    async def followed() -> AsyncIterator[bytes]:
        try:
            async for chunk in _lines(api, job_id, number, since, renew):
                yield chunk
        finally:
            await hold.__aexit__(None, None, None)

    return StreamingResponse(followed(), media_type="application/x-ndjson")


def _line(line: LogLine) -> bytes:
    return (json.dumps({"cursor": line.cursor, "time": line.time, "stream": line.stream,
                        "text": line.text}) + "\n").encode()


async def _lines(api: ApiState, job_id: str, attempt: int, cursor: str,
                 renew: Callable[[], Awaitable[None]] | None) -> AsyncIterator[bytes]:
    """The attempt's lines after ``cursor``; with ``renew`` (a follow), then the new ones as
    they come, until the job ends or moves to a later attempt (appends are fenced on the
    attempt: once it is over nothing more arrives) and the stream is drained."""
    polls, store = api.polls, api.client.store
    loop = asyncio.get_running_loop()
    renewed = loop.time()
    while True:
        lines = await polls.run(store.read_logs, job_id, attempt, cursor, LOG_BATCH, 0.0)
        for line in lines:
            cursor = line.cursor
            yield _line(line)
        if renew is not None and loop.time() - renewed >= RENEW_EVERY_S:
            await renew()
            renewed = loop.time()
        if lines:
            continue
        if renew is None:
            return
        job = await polls.run(api.client.get, job_id)
        if job.state in TERMINAL or job.attempt != attempt:
            renew = None  # one more read: what came before it ended
            continue
        await asyncio.sleep(LOG_TICK_S)
