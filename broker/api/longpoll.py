"""Long polls (``wait``, and ``logs`` with ``follow``) that hold no worker thread while they
wait, and a cap on how many one token may hold open.

* :class:`OpenPolls`: each token's open long polls, a sorted set in Redis (poll id -> when
  its hold runs out), so every server process counts the same polls and a process that dies
  leaks none past its holds. Taking one more than the cap raises :class:`RateLimited` (429)
  with the seconds until the token's first hold runs out (``Retry-After``).
* :class:`LongPolls`: one server process's long polls: a single task per event loop reads
  the ends of every job being waited on in one batched store read a tick, and wakes the
  waiters; their short blocking reads run in a thread pool of their own
  (:data:`POLL_THREADS`), never in the one the other routes use. 200 waits cost one
  ``get_many`` of 200 ids every :data:`TICK_S`, and no thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import math
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import anyio
import anyio.to_thread
import redis

from broker.errors import ConfigError
from broker.model import Job
from broker.model.state import TERMINAL
from broker.security.tokens import RateLimited, TokenRecord

log = logging.getLogger("spillway.api")

T = TypeVar("T")

DEFAULT_LONG_POLLS = 8  # open waits and log follows a token may hold (SPILLWAY_API_LONG_POLLS)
TICK_S = 0.2  # how often the watched jobs are read (one batched read for all of them)
POLL_THREADS = 8  # threads for the long polls' short blocking reads, apart from the routes'
DISCONNECT_CHECK_S = 1.0  # a waiter checks this often whether its client went away
FOLLOW_HOLD_S = 30.0  # a log follow's hold, renewed while it streams (a dead process's ends)
HOLD_SLACK_S = 1.0  # a wait's hold runs this long past its timeout (what a crash leaks)

# KEYS[1]: a token's open polls (poll id -> when its hold runs out); ARGV: now, until, cap, id.
# '' when taken; else the seconds until the first hold runs out.
_TAKE = """
local now = tonumber(ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[3]) then
  local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
  return tostring(tonumber(first[2]) - now)
end
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[4])
local ttl = math.ceil(tonumber(ARGV[2]) - now) + 1
if redis.call('TTL', KEYS[1]) < ttl then redis.call('EXPIRE', KEYS[1], ttl) end
return ''
"""

# KEYS[1], ARGV: now, until, id. Extends a hold still there (XX: a lapsed one stays gone).
_RENEW = """
if redis.call('ZADD', KEYS[1], 'XX', 'CH', ARGV[2], ARGV[3]) == 1 then
  local ttl = math.ceil(tonumber(ARGV[2]) - tonumber(ARGV[1])) + 1
  if redis.call('TTL', KEYS[1]) < ttl then redis.call('EXPIRE', KEYS[1], ttl) end
end
return 0
"""


def check_cap(cap: int, where: str = "long_polls") -> int:
    """``cap`` if it is a usable cap on a token's open long polls; ConfigError naming
    ``where`` otherwise."""
    if isinstance(cap, bool) or not isinstance(cap, int) or not 1 <= cap <= 100_000:
        raise ConfigError(f"{where}: {cap!r} is not a number of open long polls; give a whole "
                          f"number from 1 to 100000 (default {DEFAULT_LONG_POLLS})")
    return cap


def long_polls_from(env: Mapping[str, str]) -> int:
    """The cap on a token's open long polls: ``SPILLWAY_API_LONG_POLLS``, default 8;
    ConfigError naming the variable for anything but a whole number from 1 to 100000."""
    raw = env.get("SPILLWAY_API_LONG_POLLS", "").strip()
    if not raw:
        return DEFAULT_LONG_POLLS
    try:
        cap = int(raw)
    except ValueError:
        raise ConfigError(f"SPILLWAY_API_LONG_POLLS: {raw!r} is not a whole number; give the "
                          f"open waits and log follows a token may hold, 1 to 100000 (default "
                          f"{DEFAULT_LONG_POLLS})") from None
    return check_cap(cap, "SPILLWAY_API_LONG_POLLS")


class OpenPolls:
    """Each token's open long polls in Redis, under ``prefix`` (the store's)."""

    def __init__(self, client: redis.Redis, cap: int = DEFAULT_LONG_POLLS,
                 prefix: str = "sw:") -> None:
        self.redis, self.cap = client, check_cap(cap)
        self._prefix = f"{prefix}longpolls:"
        self._take = client.register_script(_TAKE)
        self._renew = client.register_script(_RENEW)

    def key(self, token_id: str) -> str:
        return self._prefix + token_id

    def take(self, who: TokenRecord, poll_id: str, hold_s: float, now: float) -> None:
        """Count one more open poll for ``who`` until ``now + hold_s``; RateLimited (429,
        with the seconds until its first open poll's hold runs out) past the cap."""
        left = self._take(keys=[self.key(who.id)], args=[now, now + hold_s, self.cap, poll_id])
        if left in (b"", "", None):
            return
        wait = min(60, max(1, math.ceil(float(left))))
        raise RateLimited(
            f"too many open long polls: token {who.id} ({who.user}) already holds {self.cap} "
            f"waits or log follows open, the most a token may; retry in {wait}s, or end one "
            "of them (the cap is the server's SPILLWAY_API_LONG_POLLS)", float(wait))

    def renew(self, who: TokenRecord, poll_id: str, hold_s: float, now: float) -> None:
        self._renew(keys=[self.key(who.id)], args=[now, now + hold_s, poll_id])

    def give_back(self, who: TokenRecord, poll_id: str) -> None:
        self.redis.zrem(self.key(who.id), poll_id)

    def count(self, token_id: str, now: float) -> int:
        """The token's open polls (holds not run out by ``now``)."""
        return int(self.redis.zcount(self.key(token_id), f"({now}", "+inf"))


@dataclass
class _Watch:
    ended: asyncio.Event
    waiters: int = 0


@dataclass
class _Loop:
    """What the long polls keep per event loop (uvicorn runs one a process; a test's
    ``asyncio.run`` makes a new one each call)."""

    loop: asyncio.AbstractEventLoop
    limiter: anyio.CapacityLimiter
    watched: dict[str, _Watch] = field(default_factory=dict)
    task: asyncio.Task[None] | None = None


class LongPolls:
    """The long polls of one server process (see the module docstring). ``read`` is the
    store's ``get_many``: one batched read of every watched job a tick."""

    def __init__(self, opened: OpenPolls, read: Callable[[Sequence[str]], list[Job | None]],
                 tick_s: float = TICK_S) -> None:
        self.opened, self._read, self.tick_s = opened, read, tick_s
        self._here: _Loop | None = None

    def _state(self) -> _Loop:
        loop = asyncio.get_running_loop()
        if self._here is None or self._here.loop is not loop:
            self._here = _Loop(loop, anyio.CapacityLimiter(POLL_THREADS))
        return self._here

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` (a short blocking read) in the long polls' own threads."""
        return await anyio.to_thread.run_sync(functools.partial(fn, *args),
                                              limiter=self._state().limiter)

    @contextlib.asynccontextmanager
    async def held(self, who: TokenRecord, hold_s: float
                   ) -> AsyncIterator[Callable[[], Awaitable[None]]]:
        """One open poll of ``who`` while the block runs (RateLimited past the cap); yields
        a call that renews its hold for another ``hold_s`` (a log follow, while it streams)."""
        poll_id = secrets.token_hex(8)
        await self.run(self.opened.take, who, poll_id, hold_s, time.time())

        async def renew() -> None:
            await self.run(self.opened.renew, who, poll_id, hold_s, time.time())

        try:
            yield renew
        finally:
            with anyio.CancelScope(shield=True):
                try:
                    await self.run(self.opened.give_back, who, poll_id)
                except redis.RedisError as e:  # its hold runs out by itself
                    log.warning("could not close long poll %s: %s", poll_id, type(e).__name__)

    async def until_ended(self, job_id: str, timeout: float,
                          gone: Callable[[], Awaitable[bool]]) -> None:
        """Return once the job has ended (or is no longer in the store's live records), after
        ``timeout`` seconds, or once ``gone()`` says the client went away."""
        here = self._state()
        watch = here.watched.get(job_id)
        if watch is None:
            watch = here.watched[job_id] = _Watch(asyncio.Event())
        watch.waiters += 1
        if here.task is None or here.task.done():
            here.task = here.loop.create_task(self._watch(here))
        try:
            deadline = here.loop.time() + timeout
            while not watch.ended.is_set():
                left = deadline - here.loop.time()
                if left <= 0:
                    return
                with anyio.move_on_after(min(left, DISCONNECT_CHECK_S)):
                    await watch.ended.wait()
                if not watch.ended.is_set() and await gone():
                    return
        finally:
            watch.waiters -= 1
            if watch.waiters <= 0 and here.watched.get(job_id) is watch:
                del here.watched[job_id]

    async def _watch(self, here: _Loop) -> None:
        """Read every watched job once a tick until none is watched; wake the waiters of
        those that ended. A failed read is tried again next tick (the waits time out)."""
        while here.watched:
            ids = list(here.watched)
            try:
                jobs = await self.run(self._read, ids)
            except Exception as e:  # (Redis away: try again; never end the watch silently)
                log.warning("reading %d watched job(s) failed: %s", len(ids), type(e).__name__)
            else:
                for job_id, job in zip(ids, jobs):
                    watch = here.watched.get(job_id)
                    if watch is not None and (job is None or job.state in TERMINAL):
                        watch.ended.set()
            await asyncio.sleep(self.tick_s)
