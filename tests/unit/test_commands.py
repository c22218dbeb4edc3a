"""broker.bus.commands (every Celery message, by name) and the actuator's refusal of cloud work
when no provider is configured. Messages go to a recorder; the store is in memory, except
for the cycle trigger, which coalesces through real Redis keys."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any, cast

import pytest
import redis
from celery import Celery

from broker.bus import commands
from broker.bus.runtime import Runtime
from broker.config.core import Config
from broker.cycle.actuator import NoProvisioner, apply_plan
from broker.cycle.plan import Launch, Plan, Start, Terminate
from broker.errors import ConfigError
from broker.model import Allocation, Gpu, JobSpec, Node, Reason
from broker.model.state import JobState
from broker.store import MemoryStore
from tests.builders import job
from tests.conftest import with_db

DB = 14  # a database no other test module uses (the trigger keys are unprefixed)


@dataclass
class Recorder:
    """Stands in for the Celery app: records ``send_task`` calls."""

    sent: list[tuple[str, list[Any], str]] = field(default_factory=list)

    def send_task(self, name: str, args: list[Any] | None = None, queue: str = "",
                  **_: Any) -> None:
        self.sent.append((name, list(args or []), queue))


def app(rec: Recorder) -> Celery:
    return cast(Celery, rec)


def test_task_names_are_spillway_names_and_distinct() -> None:
    names = commands.NODE_TASKS + commands.PROVISION_TASKS
    assert len(set(names)) == len(names) == 5
    assert all(n.startswith("spillway.") for n in names)


def test_one_start_message_per_node() -> None:
    rec = Recorder()
    a = job("a", allocations=(Allocation("n1", ("g0",), 0), Allocation("n2", ("g0",), 1)))
    b = job("b", allocations=(Allocation("n1", ("g1",), 0),))
    assert commands.start_jobs(app(rec), [a, b]) == 2
    assert rec.sent == [(commands.START_JOBS, [[["a", 1], ["b", 1]]], "node.n1"),
                        (commands.START_JOBS, [[["a", 1]]], "node.n2")]


def test_stops_skip_parts_that_already_exited() -> None:
    rec = Recorder()
    gang = job("g", allocations=(Allocation("n1", ("g0",), 0), Allocation("n2", ("g0",), 1)))
    gang = replace(gang, parts_exited=((0, 0),))
    assert commands.stop_jobs(app(rec), [gang], 7) == 1
    assert rec.sent == [(commands.STOP_JOB, ["g", 1, 7.0], "node.n2")]


def test_provision_commands_go_to_the_provision_queue() -> None:
    rec = Recorder()
    commands.launch(app(rec), "aws:us-east-1:p4d", 2, "req-1", ("a", "b"))
    commands.terminate(app(rec), ("i-1",), "idle")
    assert rec.sent == [(commands.LAUNCH, ["aws:us-east-1:p4d", 2, "req-1", ["a", "b"]],
                         "provision"),
                        (commands.TERMINATE, [["i-1"], "idle"], "provision")]


@pytest.fixture
def raw(redis_url: str) -> Iterator[redis.Redis]:
    r = redis.Redis.from_url(with_db(redis_url, DB))
    r.flushdb()
    try:
        yield r
    finally:
        r.flushdb()
        r.close()


def test_triggers_coalesce_into_one_wake_up(raw: redis.Redis) -> None:
    for _ in range(3):
        commands.trigger_cycle(raw)
    assert raw.get(commands.DIRTY) == b"1"
    assert raw.lrange(commands.WAKE, 0, -1) == [b"1"]  # the leader wakes once
    assert raw.blpop([commands.WAKE], timeout=1) == (commands.WAKE.encode(), b"1")


# -- the actuator ---------------------------------------------------------------------------


@dataclass
class FakeRuntime:
    config: Config
    store: MemoryStore
    celery: Recorder
    outbox: commands.Outbox | None = None


def runtime(config: Config | None = None) -> tuple[Runtime, FakeRuntime]:
    cfg = config or Config()
    fake = FakeRuntime(cfg, MemoryStore(cfg), Recorder())
    return cast(Runtime, fake), fake


def a_start(fake: FakeRuntime) -> Start:
    node = Node("n1", (Gpu("g0", 0, "A100-80GB", 80.0),), incarnation="i1")
    fake.store.heartbeat(node, ttl=1e9, now=0.0)
    j = fake.store.submit(JobSpec(command="true", gpus=1), now=0.0)
    return Start(j.id, j.attempt, j.version, (Allocation("n1", ("g0",), 0),))


@pytest.mark.parametrize("plan_kw, words", [
    ({"launches": (Launch("aws:p4d", 3, "req-1", ("a",)),)}, "launch 3 instance(s)"),
    ({"terminations": (Terminate(("i-1", "i-2"), "idle"),)}, "terminate 2 instance(s)"),
])
def test_a_plan_with_cloud_work_is_refused_whole_without_providers(
        plan_kw: dict[str, Any], words: str) -> None:
    rt, fake = runtime()
    start = a_start(fake)
    plan = Plan(starts=(start,), pending={"x": Reason("Resources", "waiting")}, order=("x",),
                **plan_kw)
    with pytest.raises(NoProvisioner) as err:
        apply_plan(rt, plan)
    assert isinstance(err.value, ConfigError)
    message = str(err.value)
    assert words in message and "no cloud provider is configured" in message
    assert "providers:" in message
    # nothing was written: the job is still pending, no order recorded, nothing sent
    assert fake.store.get(start.job_id).state is JobState.PENDING
    assert fake.store.last_order() is None
    assert fake.celery.sent == []


def test_with_providers_configured_cloud_work_is_sent_after_the_store_write() -> None:
    rt, fake = runtime(Config(providers={"aws": {"regions": ["us-east-1"]}}))
    start = a_start(fake)
    plan = Plan(starts=(start,), launches=(Launch("aws:p4d", 1, "req-1", ()),),
                terminations=(Terminate(("i-9",), "idle"),))
    applied = apply_plan(rt, plan)
    assert [j.id for j in applied.started] == [start.job_id]
    assert [name for name, _, _ in fake.celery.sent] == [
        commands.START_JOBS, commands.LAUNCH, commands.TERMINATE]


def test_a_plan_without_cloud_work_applies_and_sends_starts() -> None:
    rt, fake = runtime()
    start = a_start(fake)
    applied = apply_plan(rt, Plan(starts=(start,)))
    assert [j.id for j in applied.started] == [start.job_id]
    assert fake.celery.sent == [(commands.START_JOBS, [[[start.job_id, 1]]], "node.n1")]



# -- the outbox (the leading scheduler's sends) ---------------------------------------------


def test_the_outbox_sends_in_order_and_a_failed_send_does_not_stop_the_next() -> None:
    box, sent = commands.Outbox(), []

    def send(n: int) -> None:
        if n == 2:
            raise redis.ConnectionError("down")
        sent.append(n)

    for n in range(5):
        box.post(send, n)
    assert box.flush(timeout=10)
    assert sent == [0, 1, 3, 4]
    assert box.close(timeout=10)


def test_the_outbox_flush_waits_for_a_send_in_progress() -> None:
    import threading

    box, gate, sent = commands.Outbox(), threading.Event(), []
    box.post(lambda: (gate.wait(10), sent.append("slow")))
    box.post(sent.append, "next")
    assert not box.flush(timeout=0.05)  # the first send is held: nothing is done yet
    gate.set()
    assert box.flush(timeout=10) and sent == ["slow", "next"]
    box.close()


def test_with_an_outbox_the_starts_are_sent_by_it_after_the_store_write(
        monkeypatch: pytest.MonkeyPatch) -> None:
    rt, fake = runtime()
    fake.outbox = commands.Outbox()
    seen: list[JobState] = []
    real = commands.start_jobs

    def start_jobs(celery: Celery, jobs: Any) -> int:
        jobs = list(jobs)
        seen.extend(fake.store.get(j.id).state for j in jobs)  # written before it is sent
        return real(celery, jobs)

    st = a_start(fake)
    monkeypatch.setattr(commands, "start_jobs", start_jobs)
    try:
        applied = apply_plan(rt, Plan(starts=(st,)))
        assert fake.outbox.flush(timeout=10)
    finally:
        fake.outbox.close()
    assert [j.id for j in applied.started] == [st.job_id]
    assert seen == [JobState.STARTING]
    assert fake.celery.sent == [(commands.START_JOBS, [[[st.job_id, 1]]], "node.n1")]
