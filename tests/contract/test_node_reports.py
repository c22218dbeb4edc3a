"""Agents' reports applied by the scheduler (broker/store/node_reports.py), and the agent's
own side of Redis (workers/channel.py): a node's reports change only what runs on that node."""

from __future__ import annotations

import time

import pytest
import redis

from broker.config.core import Config
from broker.cycle.plan import Plan, Preempt
from broker.errors import StaleAttempt
from broker.model.state import EvictionKind, JobState
from broker.store import BaseStore, RedisStore
from broker.store import node_reports as nr
from broker.store.events import Exited, Started, StartFailed
from broker.store.node_reports import Noticed, Preempted, Registered, Report
from tests.contract.test_store_contract import T0, live, node, running, spec, start_of
from workers.channel import RedisChannel

S = JobState


def placed(store: BaseStore, *parts: tuple[str, list[str]], **kw: object) -> str:
    job = store.submit(spec(gpus=len(parts[0][1]), nodes=len(parts), **kw), T0)
    applied = store.apply(Plan(starts=(start_of(job, *parts),)), T0)
    assert [j.id for j in applied.started] == [job.id], applied.skipped
    return job.id


# -- who may report what ----------------------------------------------------------------------


@pytest.mark.parametrize("event", [Started(0), Exited(0, 0), Exited(0, 1), StartFailed(0, "x"),
                                   Preempted("priority", "room")])
def test_a_node_cannot_report_on_a_job_placed_elsewhere(store: BaseStore, event: object
                                                         ) -> None:
    live(store, node("n1"), node("n2"))
    job_id = placed(store, ("n1", ["n1-g0"]))
    before = store.get(job_id)
    out = nr.apply(store, "n2", [Report(job_id, 1, event, T0 + 1)], T0 + 1)  # type: ignore[arg-type]
    assert out.applied == 0 and len(out.refused) == 1 and job_id in out.refused[0]
    assert store.get(job_id) == before  # nothing changed: no state, no history, no version


def test_a_node_cannot_report_on_another_rank_of_its_gang(store: BaseStore) -> None:
    live(store, node("n1"), node("n2"))
    job_id = placed(store, ("n1", ["n1-g0"]), ("n2", ["n2-g0"]))
    out = nr.apply(store, "n2", [Report(job_id, 1, Exited(0, 1), T0 + 1)], T0 + 1)
    assert out.refused and store.get(job_id).state is S.STARTING
    out = nr.apply(store, "n2", [Report(job_id, 1, Exited(1, 1), T0 + 1)], T0 + 1)
    assert not out.refused and out.applied == 1
    failed = store.get(job_id)
    assert failed.state is S.STOPPING and failed.stop_target is S.FAILED
    assert [j.id for j in out.stop] == [job_id]  # the scheduler tells n1 to stop its part


def test_own_reports_apply_once_and_a_repeat_changes_nothing(store: BaseStore) -> None:
    live(store, node("n1"))
    job_id = placed(store, ("n1", ["n1-g0"]))
    reports = [Report(job_id, 1, Started(0, 4242), T0 + 1),
               Report(job_id, 1, Exited(0, 0), T0 + 2)]
    out = nr.apply(store, "n1", reports, T0 + 2)
    assert out.applied == 2 and out.ended and not out.refused
    done = store.get(job_id)
    assert done.state is S.SUCCEEDED and store.allocations(["n1"])["n1"] == {}
    # a leader that died before deleting them: the next applies them again, harmlessly
    out = nr.apply(store, "n1", reports, T0 + 3)
    assert out.applied == 0 and store.get(job_id) == done


def test_a_stale_attempt_is_dropped_quietly_and_a_future_one_refused(store: BaseStore
                                                                      ) -> None:
    live(store, node("n1"))
    job_id = placed(store, ("n1", ["n1-g0"]))
    nr.apply(store, "n1", [Report(job_id, 1, Preempted("priority", "drain"), T0 + 1),
                           Report(job_id, 1, Exited(0, 143, "Stopped"), T0 + 1)], T0 + 1)
    store.apply(Plan(starts=(start_of(store.get(job_id), ("n1", ["n1-g1"])),)), T0 + 2)
    assert store.get(job_id).attempt == 2
    out = nr.apply(store, "n1", [Report(job_id, 1, Exited(0, 0), T0 + 3)], T0 + 3)
    assert out.applied == 0 and not out.refused  # (a late report of attempt 1)
    out = nr.apply(store, "n1", [Report(job_id, 7, Exited(0, 0), T0 + 3)], T0 + 3)
    assert out.applied == 0 and out.refused  # (no attempt 7 was placed anywhere)
    assert store.get(job_id).state is S.STARTING


def test_a_preemption_report_stops_the_job_and_its_other_parts(store: BaseStore) -> None:
    live(store, node("n1"), node("n2"))
    job_id = placed(store, ("n1", ["n1-g0"]), ("n2", ["n2-g0"]))
    out = nr.apply(store, "n1", [Report(job_id, 1, Preempted("spot", "Node n1: notice"),
                                        T0 + 1)], T0 + 1)
    job = store.get(job_id)
    assert job.state is S.STOPPING and job.stop_target is S.PREEMPTED
    assert job.history[-1].kind is EvictionKind.SPOT
    assert [j.id for j in out.stop] == [job_id]
    out = nr.apply(store, "n1", [Report(job_id, 1, Exited(0, 143, "Stopped"), T0 + 2)], T0 + 2)
    out = nr.apply(store, "n2", [Report(job_id, 1, Exited(1, 143, "Stopped"), T0 + 2)], T0 + 2)
    requeued = store.get(job_id)
    assert requeued.state is S.PENDING and requeued.attempt == 2


def test_entries_survive_encoding_and_a_bad_one_is_none() -> None:
    for event in (Started(1, 99, "note"), Exited(0, 3, "Signal"), StartFailed(0, "no cmd"),
                  Preempted("relief", "why"), Registered("inc-1"), Noticed("aws notice")):
        r = Report("j-1", 2, event, 12.5)  # type: ignore[arg-type]
        fields = {k.encode(): v.encode() for k, v in nr.encode(r).items()}
        assert nr.decode(fields) == r
    assert nr.decode({b"k": b"started", b"e": b"{not json", b"t": b"1"}) is None
    assert nr.decode({b"k": b"rm -rf", b"e": b"{}", b"t": b"1"}) is None
    assert nr.decode({b"k": b"exited", b"e": b'{"bogus": 1}', b"t": b"1"}) is None


# -- the Redis side: an agent's channel, the leader's reading ---------------------------------


@pytest.fixture
def rs(redis_client: redis.Redis, redis_prefix: str) -> RedisStore:
    return RedisStore(redis_client, Config(), prefix=redis_prefix)


def leader_applies(store: RedisStore) -> nr.Outcome:
    """What the leading scheduler does before each cycle (broker/control/loop.py)."""
    total = nr.Outcome()
    for node_id, entries in store.take_node_reports():
        reports = [r for r in (nr.decode(f) for _, f in entries) if r is not None]
        out = nr.apply(store, node_id, reports, time.time())
        total.applied += out.applied
        total.lost += out.lost
        total.refused += out.refused
        store.done_node_reports(node_id, [e for e, _ in entries])
    return total


def test_a_new_agent_takes_jobs_only_once_the_leader_took_it(rs: RedisStore,
                                                             redis_client: redis.Redis,
                                                             redis_prefix: str) -> None:
    ch = RedisChannel(redis_client, "n1", redis_prefix)
    first = node("n1", incarnation="i1")
    ch.heartbeat(first, 1e6, T0)
    assert not ch.acked("i1")
    assert [n.state.value for n in rs.nodes()] == []  # (not in the node list yet)
    leader_applies(rs)
    assert ch.acked("i1") and [n.id for n in rs.nodes()] == ["n1"]
    job = running(rs, rs.submit(spec(gpus=1), T0), ("n1", ["n1-g0"]))
    # the agent restarts: until the leader applies its registration, nothing goes there and
    # its earlier jobs stand; then they are requeued, once
    again = RedisChannel(redis_client, "n1", redis_prefix)
    again.heartbeat(node("n1", incarnation="i2"), 1e6, T0 + 5)
    assert not again.acked("i2")
    (shown,) = rs.nodes()
    assert shown.state.value == "DOWN" and rs.get(job.id).state is S.RUNNING
    other = rs.submit(spec(gpus=1), T0)
    applied = rs.apply(Plan(starts=(start_of(other, ("n1", ["n1-g1"])),)), T0 + 5)
    assert applied.started == () and applied.skipped  # a claim there is refused ('dead')
    out = leader_applies(rs)
    assert [j.id for j in out.lost] == [job.id] and again.acked("i2")
    assert rs.get(job.id).state is S.PENDING and rs.get(job.id).attempt == 2
    assert leader_applies(rs).lost == []  # (the registration is gone, and taken anyway)


def test_the_view_holds_the_jobs_placed_there_and_logs_need_it(
        rs: RedisStore, redis_client: redis.Redis, redis_prefix: str) -> None:
    live(rs, node("n1"), node("n2"))
    ch1 = RedisChannel(redis_client, "n1", redis_prefix)
    ch2 = RedisChannel(redis_client, "n2", redis_prefix)
    job_id = placed(rs, ("n1", ["n1-g0"]), ("n2", ["n2-g0"]), env={"HF_TOKEN": "s3cr3t-v"})
    v1, v2 = ch1.view(), ch2.view()
    assert set(v1.jobs) == set(v2.jobs) == {job_id} and v1.refused == {}
    assert v1.jobs[job_id].spec.env == {"HF_TOKEN": "s3cr3t-v"}  # (it runs it)
    assert v1.owners == {f"{job_id}:1"}
    ch1.append_logs(job_id, 1, [("out", "rank0 a"), ("out", "rank0 b")], T0 + 1)
    ch2.append_logs(job_id, 1, [("err", "rank1 a")], T0 + 0.5)
    lines = rs.read_logs(job_id, 1)
    assert [x.text for x in lines] == ["rank1 a", "rank0 a", "rank0 b"]  # merged by time
    assert rs.read_logs(job_id, 1, cursor=lines[0].cursor)[0].text == "rank0 a"
    ch2.append_logs(job_id, 1, [("out", "rank1 b")], T0 + 2)
    assert [x.text for x in rs.read_logs(job_id, 1, cursor=lines[-1].cursor)] == ["rank1 b"]
    # a node the job does not run on may not log for it
    ch3 = RedisChannel(redis_client, "n3", redis_prefix)
    with pytest.raises(StaleAttempt):
        ch3.append_logs(job_id, 1, [("out", "forged")], T0 + 3)
    # the job leaves: its views forget it, and late lines are refused
    rs.apply(Plan(preemptions=(Preempt(job_id, 1, "room", 5.0),)), T0 + 4)
    for rank in (0, 1):
        rs.report(job_id, 1, Exited(rank, 143, "Stopped"), T0 + 5)
    assert ch1.view().jobs == {} and ch2.view().jobs == {}
    with pytest.raises(StaleAttempt):
        ch1.append_logs(job_id, 1, [("out", "late")], T0 + 6)


def test_a_record_changed_after_submit_is_refused_by_the_view(
        rs: RedisStore, redis_client: redis.Redis, redis_prefix: str) -> None:
    import json

    live(rs, node("n1"))
    job = rs.submit(spec(gpus=1), T0)
    raw = json.loads(redis_client.hget(f"{redis_prefix}job:{job.id}", "doc"))
    raw["spec"]["command"] = ["echo", "TAMPERED"]
    redis_client.hset(f"{redis_prefix}job:{job.id}", "doc", json.dumps(raw))
    tampered = rs.get(job.id)
    rs.apply(Plan(starts=(start_of(tampered, ("n1", ["n1-g0"])),)), T0)
    view = RedisChannel(redis_client, "n1", redis_prefix).view()
    assert "SpecTampered" in view.refused[job.id]
