"""The API's long polls without a server: a token's cap on open ones (in Redis: holds that
run out, renewed, given back), the setting's bad values named, and the watcher that wakes
every waiter of a job with one batched read a tick."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest
import redis

from broker.api.longpoll import LongPolls, OpenPolls, long_polls_from
from broker.api.server import ServeOptions
from broker.errors import ConfigError
from broker.model import Job, JobSpec
from broker.model.state import JobState
from broker.security.tokens import RateLimited, TokenRecord

T0 = 1_800_000_000.0
WHO = TokenRecord("0123456789ab", "alice", "user", ("vision",), T0, "test", None)


@pytest.fixture
def opened(redis_client: redis.Redis, redis_prefix: str) -> OpenPolls:
    return OpenPolls(redis_client, 2, prefix=redis_prefix)


def test_a_token_holds_at_most_its_cap_and_is_told_when_to_retry(opened: OpenPolls) -> None:
    opened.take(WHO, "p1", 30.0, T0)
    opened.take(WHO, "p2", 10.0, T0)
    with pytest.raises(RateLimited, match=r"token 0123456789ab \(alice\) already holds 2 ") as e:
        opened.take(WHO, "p3", 30.0, T0 + 1)
    assert e.value.retry_after == 9  # until the first hold runs out
    other = TokenRecord("ba9876543210", "bob", "user", ("vision",), T0, "test", None)
    opened.take(other, "q1", 30.0, T0 + 1)  # each token its own cap
    opened.give_back(WHO, "p1")
    opened.take(WHO, "p3", 30.0, T0 + 1)
    assert opened.count(WHO.id, T0 + 1) == 2


def test_holds_run_out_unless_renewed(opened: OpenPolls) -> None:
    opened.take(WHO, "p1", 5.0, T0)
    opened.take(WHO, "p2", 5.0, T0)
    opened.renew(WHO, "p2", 30.0, T0 + 4)
    assert opened.count(WHO.id, T0 + 6) == 1  # p1's hold ran out: a dead process's poll
    opened.take(WHO, "p3", 5.0, T0 + 6)
    opened.renew(WHO, "p1", 30.0, T0 + 7)  # a lapsed hold stays gone
    assert opened.count(WHO.id, T0 + 7) == 2


@pytest.mark.parametrize("raw, problem", [("many", "is not a whole number"),
                                          ("0", "is not a number of open long polls"),
                                          ("-3", "is not a number of open long polls"),
                                          ("1e9", "is not a whole number")])
def test_a_bad_cap_is_refused_naming_the_variable(raw: str, problem: str) -> None:
    with pytest.raises(ConfigError, match=f"SPILLWAY_API_LONG_POLLS: .*{problem}.*1 to 100000"):
        long_polls_from({"SPILLWAY_API_LONG_POLLS": raw})
    assert long_polls_from({}) == 8 and long_polls_from({"SPILLWAY_API_LONG_POLLS": "200"}) == 200
    with pytest.raises(ConfigError, match="--long-polls: 0 is not"):
        ServeOptions("redis://127.0.0.1:6379/0", long_polls=0).check()


def _job(job_id: str, state: JobState) -> Job:
    return Job(job_id, JobSpec(command="true"), state, T0)


def test_one_read_a_tick_wakes_every_waiter_of_a_job(opened: OpenPolls) -> None:
    states = {"j-a": JobState.PENDING, "j-b": JobState.RUNNING}
    reads: list[list[str]] = []

    def read(ids: Sequence[str]) -> list[Job | None]:
        reads.append(sorted(ids))
        return [_job(i, states[i]) if i in states else None for i in ids]

    polls = LongPolls(opened, read, tick_s=0.01)

    async def gone() -> bool:
        return False

    async def scenario() -> list[float]:
        loop = asyncio.get_running_loop()
        t0 = loop.time()

        async def waiter(job_id: str, timeout: float) -> float:
            await polls.until_ended(job_id, timeout, gone)
            return loop.time() - t0

        tasks = [asyncio.ensure_future(waiter(j, t)) for j, t in
                 (("j-a", 10), ("j-a", 10), ("j-b", 0.3), ("j-gone", 10))]
        async def first_read() -> None:
            while not reads:
                await asyncio.sleep(0.01)

        await asyncio.wait_for(first_read(), 5)  # (a deadline: the watcher read once)
        states["j-a"] = JobState.SUCCEEDED
        return list(await asyncio.gather(*tasks))

    took = asyncio.run(scenario())
    assert max(took[0], took[1], took[3]) < 5  # ended (or gone): woken within ticks
    assert 0.3 <= took[2] < 5  # never ended: back at its timeout
    assert all(len(r) <= 3 for r in reads) and ["j-a", "j-b", "j-gone"] in reads  # batched
