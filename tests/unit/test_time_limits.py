"""Time limits are bounded and exact (issue 35, item 4): one table of values, at the client, at
the API and at the agent.

At submit a limit must be finite, > 0 and at most ``max_time_limit_s`` (30 days by default),
else SpecError (the API: 422) names ``time_limit``; a limit that is taken is stored exactly as
asked. At the agent, a record that holds anything else (written by an older client) runs
under a bounded timer, never one that overflows epoll's millisecond timeout (about 24.8 days)
or spins on a NaN, and the supervisor keeps serving its other parts."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from broker.client import Client
from broker.config.core import Config, load_config
from broker.cycle.plan import Plan, Start
from broker.errors import ConfigError, SpecError
from broker.model import Allocation, Gpu, Job, JobSpec, Node
from broker.security.tokens import TokenStore
from broker.store.memory import MemoryStore
from tests.asgi import call
from tests.conftest import private_redis
from workers.runner import _MAX_WAIT_S, RunningPart, Supervisor, time_limit_for

D = 86400.0
MAX = 30 * D
NODE = "n1"

#: (value, taken at submit?, what the refusal says)
TABLE: list[tuple[Any, bool, str]] = [
    (1.0, True, ""),
    (24 * D, True, ""),
    (25 * D, True, ""),
    (30 * D, True, ""),
    (30 * D + 1, False, "longer than the longest allowed"),
    (math.nan, False, "finite"),
    (math.inf, False, "finite"),
    (-math.inf, False, "finite"),
    (-60.0, False, "positive"),
    (0.0, False, "positive"),
    (1e300, False, "longer than the longest allowed"),
    ("25d", True, ""),
    ("30d1s", False, "longer than the longest allowed"),
    ("9" * 400, False, "finite"),
]
IDS = [str(v)[:12] for v, _, _ in TABLE]
#: what a stored record holds: seconds (a record never holds a duration's text)
NUMBERS = [(v, ok) for v, ok, _ in TABLE if not isinstance(v, str)]


def seconds(value: Any) -> float:
    return float(value) if not isinstance(value, str) else {"25d": 25 * D}[value]


# -- the model and the configuration -----------------------------------------------------------

@pytest.mark.parametrize(("value", "ok", "words"), TABLE, ids=IDS)
def test_the_spec(value: Any, ok: bool, words: str) -> None:
    if ok:
        spec = JobSpec.parse({"command": "true", "time_limit": value}, Config())
        assert spec.time_limit == seconds(value)
        return
    with pytest.raises(SpecError) as e:
        JobSpec.parse({"command": "true", "time_limit": value}, Config())
    (err,) = e.value.errors
    assert err.field == "time_limit" and words in err.problem, err
    assert "max_time_limit_s" in err.allowed


def test_the_maximum_is_a_setting() -> None:
    cfg = Config(max_time_limit_s=40 * D)
    assert JobSpec.parse({"command": "true", "time_limit": "35d"}, cfg).time_limit == 35 * D
    with pytest.raises(SpecError, match=r"3456000s \(40 days\)"):
        JobSpec.parse({"command": "true", "time_limit": "41d"}, cfg)
    # a JobSpec built in Python is checked against it too (the client's and the store's path)
    with pytest.raises(SpecError, match="time_limit"):
        JobSpec(command="true", time_limit=41 * D).checked(cfg)
    # the maximum's other errors come with the rest
    with pytest.raises(SpecError) as e:
        JobSpec.parse({"command": "true", "time_limit": "41d", "gpus": -1}, cfg)
    assert {x.field for x in e.value.errors} == {"time_limit", "gpus"}


def test_the_setting_is_checked(tmp_path: Path) -> None:
    assert load_config(env={"SPILLWAY_MAX_TIME_LIMIT_S": "3600"}).max_time_limit_s == 3600
    for bad in ("0", "-1", "nan", "inf", "1e300"):
        with pytest.raises(ConfigError, match="SPILLWAY_MAX_TIME_LIMIT_S"):
            load_config(env={"SPILLWAY_MAX_TIME_LIMIT_S": bad})
    f = tmp_path / "c.yaml"
    f.write_text("max_time_limit_s: .nan\n")
    with pytest.raises(ConfigError, match="config max_time_limit_s"):
        load_config(f, env={})


@pytest.mark.parametrize(("field", "value", "words"), [
    ("deadline", math.nan, "between 1970"), ("deadline", math.inf, "between 1970"),
    ("deadline", -1.0, "between 1970"), ("deadline", 1e300, "between 1970"),
    ("max_price_per_hour", math.nan, "finite"), ("max_price_per_hour", math.inf, "finite"),
    ("max_price_per_hour", -1.0, "positive"), ("max_price_per_hour", 0.0, "positive"),
    ("cpus", math.nan, "finite"), ("cpus", math.inf, "finite"), ("cpus", -1.0, "zero or more"),
    ("memory_gb", math.nan, "finite"), ("memory_gb", -math.inf, "finite"),
    ("min_gpu_memory_gb", math.inf, "finite"), ("min_gpu_memory_gb", -0.5, "zero or more"),
])
def test_the_other_numbers_are_finite_and_in_range(field: str, value: float,
                                                   words: str) -> None:
    with pytest.raises(SpecError) as e:
        JobSpec.parse({"command": "true", field: value})
    (err,) = e.value.errors
    assert err.field == field and words in err.problem, err


# -- at the client and at the API ---------------------------------------------------------------

@pytest.fixture(scope="module")
def redis_url_own() -> Iterator[str]:
    with private_redis() as url:
        yield url


@pytest.fixture(scope="module")
def client(redis_url_own: str) -> Iterator[Client]:
    c = Client(redis_url_own, Config(hold_if_infeasible=True))
    try:
        yield c
    finally:
        c.close()


@pytest.mark.parametrize(("value", "ok", "words"), TABLE, ids=IDS)
def test_the_client(client: Client, value: Any, ok: bool, words: str) -> None:
    if ok:
        job = client.submit(command="true", time_limit=value)
        assert client.get(job.id).spec.time_limit == seconds(value)  # exactly as asked
        return
    with pytest.raises(SpecError) as e:
        client.submit(command="true", time_limit=value)
    assert [x.field for x in e.value.errors] == ["time_limit"]
    assert words in e.value.errors[0].problem


@pytest.fixture(scope="module")
def api(client: Client) -> tuple[Any, str]:
    from broker.api.app import create_app

    token = TokenStore(client.store_redis).create("ann", "user", ["vision"], time.time())[0]
    return create_app(client, submit_rate=1000.0, submit_burst=1000), token


@pytest.mark.parametrize(("value", "ok", "words"), TABLE, ids=IDS)
def test_the_api(client: Client, api: tuple[Any, str], value: Any, ok: bool,
                 words: str) -> None:
    app, token = api
    # (json.dumps writes NaN, Infinity and -Infinity, which the server's parser reads)
    status, doc = call(app, "POST", "/v1/jobs", {"spec": {"command": "true",
                                                          "time_limit": value}}, token)
    if ok:
        assert status == 201, doc
        assert client.get(doc["id"]).spec.time_limit == seconds(value)
        return
    assert status == 422, doc
    (err,) = doc["errors"]
    assert err["field"] == "time_limit" and words in err["problem"], err


# -- at the agent --------------------------------------------------------------------------------

def test_the_agents_bound() -> None:
    for value, ok in NUMBERS:
        limit, why = time_limit_for(value, MAX)
        assert limit is not None and 0 < limit <= MAX, value
        assert (limit, why == "") == ((seconds(value), True) if ok else (MAX, False)), value
    assert time_limit_for(None, MAX) == (None, "")
    assert time_limit_for("garbage", MAX)[0] == MAX
    assert time_limit_for("9" * 400, MAX)[0] == MAX


class Agent:
    """A Supervisor on a MemoryStore, and jobs whose stored records say anything at all."""

    def __init__(self, tmp: Path, max_s: float = MAX) -> None:
        self.store = MemoryStore()
        self.store.heartbeat(Node(NODE, (Gpu("GPU-a", 0, "A100-80GB", 80.0),),
                                  incarnation="i1"), 1e9, 0.0)
        self.sup = Supervisor(self.store, str(tmp / "agent"), grace_s=0.2)
        self.sup.max_time_limit_s = max_s

    def job(self, command: str, time_limit: Any = None) -> Job:
        """A job STARTING on the node whose record holds ``time_limit`` as it is (a record
        an older client wrote: never validated again)."""
        job = self.store.submit(JobSpec(command=command, gpus=0), 0.0)
        start = Start(job.id, job.attempt, job.version, (Allocation(NODE, ()),))
        assert self.store.apply(Plan(starts=(start,)), 1.0).started
        job = self.store.get(job.id)
        return job if time_limit is None else replace(
            job, spec=job.spec.model_copy(update={"time_limit": time_limit}))

    def limit_timer(self, part: RunningPart) -> float:
        """How far off the part's time-limit timer is, in seconds."""
        when = [w for w, _, kind, p in list(self.sup._timers) if p is part and kind == "limit"]
        assert len(when) == 1, when
        return when[0] - time.monotonic()


def poll(pred: Callable[[], object], timeout: float = 10.0, what: str = "it") -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def test_the_agent_never_wedges_whatever_a_record_says(tmp_path: Path) -> None:
    agent = Agent(tmp_path)
    try:
        parts = {}
        for value, _ in NUMBERS:
            part = agent.sup.spawn(agent.job("sleep 60", value), 0, (), NODE)
            assert part.start_error is None, part.start_error
            parts[str(value)[:12]] = part
        for value, ok in NUMBERS:
            part = parts[str(value)[:12]]
            off = agent.limit_timer(part)
            assert 0 < off <= (seconds(value) if ok else MAX) + 1, (value, off)
            if not ok:  # its log says what it runs under
                poll(lambda part=part: any(
                    "held to" in x.text for x in agent.store.read_logs(part.job_id, 1)),
                    what=f"the note of {value!r}")
        timeout = agent.sup._timeout()  # (what the loop's select() is given: epoll takes it)
        assert timeout is not None and 0 <= timeout <= _MAX_WAIT_S
        # the loop still serves: another part starts, runs, ends and is reported
        quick = agent.sup.spawn(agent.job("echo served"), 0, (), NODE)
        assert quick.done.wait(10) and quick.exit_code == 0
        assert [x.text for x in agent.store.read_logs(quick.job_id, 1)] == ["served"]
        # ... and stops reach the others, which end cleanly
        for part in parts.values():
            agent.sup.stop(part.job_id, part.attempt, 0.2)
        for key, part in parts.items():
            assert part.done.wait(10), key
            assert part.reason == "Stopped", (key, part.reason)
    finally:
        agent.sup.close()


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, -1.0, 0.0, 1e300, 40 * D],
                         ids=str)
def test_a_bad_limit_is_held_to_the_maximum(tmp_path: Path, value: float) -> None:
    agent = Agent(tmp_path, max_s=0.3)  # (a maximum short enough to see it enforced)
    try:
        t0 = time.monotonic()
        part = agent.sup.spawn(agent.job("sleep 60", value), 0, (), NODE)
        assert part.done.wait(10), "the part was never stopped"
        assert part.reason == "TimeLimit" and time.monotonic() - t0 >= 0.25
    finally:
        agent.sup.close()
