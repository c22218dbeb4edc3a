"""One contract, two backends: every test runs against MemoryStore and RedisStore."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import pytest

from broker.config.core import Config
from broker.cycle.plan import Plan, Preempt, Start
from broker.cycle.snapshots import SnapshotBuilder
from broker.errors import Conflict, Fenced, JobNotFound, NodeNotFound, SpecError, StaleAttempt
from broker.model import Allocation, Gpu, Job, JobSpec, Node, NodeState, Reason
from broker.model.state import EvictionKind, JobState
from broker.store import BaseStore, MemoryStore, RedisStore, open_store
from broker.store.events import STOPPED, Exited, Started, StartFailed
from broker.store.transitions import Change
from broker.waiting import poll_until

S = JobState
T0 = 1_000.0


# -- builders ---------------------------------------------------------------------------------


def node(node_id: str = "n1", gpus: int = 2, incarnation: str = "i1",
         state: NodeState = NodeState.READY) -> Node:
    return Node(
        id=node_id,
        gpus=tuple(Gpu(f"{node_id}-g{i}", i, "A100-80GB", 80.0) for i in range(gpus)),
        hostname=f"{node_id}.local", cpus=32, memory_gb=256, labels={"rack": "r1"},
        state=state, incarnation=incarnation,
    )


def spec(**kw: object) -> JobSpec:
    return JobSpec(command=["python", "train.py"], **kw)  # type: ignore[arg-type]


def start_of(job: Job, *parts: tuple[str, Sequence[str]]) -> Start:
    """A Start for ``job`` as it is now; parts are (node id, GPU ids), ranked in order."""
    allocs = tuple(Allocation(n, tuple(g), rank) for rank, (n, g) in enumerate(parts))
    return Start(job.id, job.attempt, job.version, allocs)


def live(store: BaseStore, *nodes: Node, ttl: float = 1e6, now: float = T0) -> None:
    for n in nodes:
        store.heartbeat(n, ttl, now)



def down(store: BaseStore, node_id: str) -> None:
    """Force a node DOWN through the backend primitive (as lease expiry does)."""
    n = next(n for n in store._load_nodes() if n.id == node_id)
    assert store._mark_down(node_id, n.incarnation, 1e300)

def running(store: BaseStore, job: Job, *parts: tuple[str, Sequence[str]],
            now: float = T0) -> Job:
    """Start ``job`` on ``parts`` and report every part Started."""
    applied = store.apply(Plan(starts=(start_of(job, *parts),)), now)
    assert [j.id for j in applied.started] == [job.id], applied.skipped
    for rank in range(len(parts)):
        store.report(job.id, job.attempt, Started(rank), now + 1)
    return store.get(job.id)


def owner(job: Job, attempt: int | None = None) -> str:
    return f"{job.id}:{job.attempt if attempt is None else attempt}"


# -- submit, get, list ------------------------------------------------------------------------


def test_submit_stores_a_pending_job_with_defaults(store: BaseStore) -> None:
    job = store.submit(spec(name="a"), T0)
    got = store.get(job.id)
    assert got == job
    assert (got.state, got.attempt, got.version) == (S.PENDING, 1, 1)
    assert (got.priority, got.team, got.name) == ("normal", "default", "a")
    assert [(h.state, h.time, h.reason, h.attempt) for h in got.history] == [
        (S.PENDING, T0, "Submitted", 1)
    ]
    assert got.submitted_at == T0


def test_submit_keeps_every_spec_field(store: BaseStore) -> None:
    s = spec(name="big", env={"A": "1"}, gpus=4, gpu_types=["a100"], nodes=2, priority="high",
             team="vision", time_limit="2h", deadline="2030-01-01T00:00:00Z",
             labels={"k": "v"}, sites=["onprem"], max_price_per_hour=3.5)
    job = store.submit(s, T0, job_id="j-fixed")
    got = store.get("j-fixed")
    assert got.spec == job.spec
    assert (got.spec.gpu_types, got.spec.sites, got.spec.time_limit) == (("A100",), ("onprem",),
                                                                         7200.0)


def test_get_unknown_job_raises(store: BaseStore) -> None:
    with pytest.raises(JobNotFound):
        store.get("j-nope")
    assert store.get_many(["j-nope"]) == [None]


def test_submit_with_an_existing_id_conflicts(store: BaseStore) -> None:
    store.submit(spec(name="first"), T0, job_id="j-1")
    with pytest.raises(Conflict):
        store.submit(spec(name="second"), T0 + 1, job_id="j-1")
    assert store.get("j-1").spec.name == "first"


def test_submit_many_is_all_or_none_on_a_bad_spec(store: BaseStore) -> None:
    with pytest.raises(SpecError) as err:
        store.submit_many([spec(), spec(priority="urgent")], T0)
    assert err.value.errors[0].field == "priority"
    assert store.list_jobs() == []
    assert store.snapshot(T0).pending == ()


def test_submit_many_stores_in_order(store: BaseStore) -> None:
    jobs = store.submit_many([spec(name=f"s{i}") for i in range(5)], T0,
                             job_ids=[f"j-{i}" for i in range(5)])
    assert [j.id for j in store.list_jobs()] == [j.id for j in jobs]


def test_list_jobs_filters_and_orders(store: BaseStore) -> None:
    live(store, node())
    a = store.submit(spec(team="nlp", priority="low"), T0 + 2, job_id="j-a")
    b = store.submit(spec(team="vision", priority="high"), T0 + 1, job_id="j-b")
    c = store.submit(spec(team="nlp", priority="high"), T0 + 1, job_id="j-c")
    d = store.submit(spec(team="nlp"), T0 + 3, job_id="j-d")
    running(store, c, ("n1", ["n1-g0"]))
    store.cancel(d.id, T0 + 4)

    def ids(**kw: object) -> list[str]:
        return [j.id for j in store.list_jobs(**kw)]  # type: ignore[arg-type]

    assert ids() == ["j-b", "j-c", "j-a", "j-d"]  # (submitted_at, id)
    assert ids(states=[S.PENDING]) == ["j-b", "j-a"]
    assert ids(states=[S.RUNNING]) == ["j-c"]
    assert ids(states=[S.STARTING]) == []
    assert ids(states=[S.PENDING, S.RUNNING]) == ["j-b", "j-c", "j-a"]
    assert ids(states=[S.CANCELLED]) == ["j-d"]
    assert ids(states=[S.CANCELLED, S.PENDING]) == ["j-b", "j-a", "j-d"]
    assert ids(team="nlp") == ["j-c", "j-a", "j-d"]
    assert ids(priority="high") == ["j-b", "j-c"]
    assert ids(team="nlp", priority="high") == ["j-c"]
    assert ids(team="nlp", states=[S.PENDING]) == ["j-a"]
    assert ids(limit=2) == ["j-a", "j-d"]  # the newest
    assert a.id in ids() and b.id in ids()


# -- snapshot and apply -----------------------------------------------------------------------


def test_snapshot_contents(store: BaseStore) -> None:
    live(store, node("n1"), node("n2", gpus=1))
    live(store, node("old"), ttl=10)  # lease lapses at T0 + 10
    live(store, node("dead"))
    down(store, "dead")
    p = store.submit(spec(), T0, job_id="j-p")
    r = store.submit(spec(), T0 + 1, job_id="j-r")
    done = store.submit(spec(), T0 + 2, job_id="j-done")
    running(store, r, ("n1", ["n1-g1"]))
    store.cancel(done.id, T0 + 3)

    snap = store.snapshot(T0 + 20)
    assert snap.now == T0 + 20
    assert [j.id for j in snap.pending] == [p.id]
    assert [(j.id, j.state) for j in snap.active] == [(r.id, S.RUNNING)]
    assert sorted(n.id for n in snap.nodes) == ["n1", "n2"]
    assert snap.node_by_id["n1"] == replace(node("n1"), lease_expires=T0 + 1e6)
    assert {k: dict(v) for k, v in snap.allocated.items()} == {
        "n1": {"n1-g1": owner(r)}, "n2": {}}
    assert snap.classes == store.config.classes
    assert store.snapshot(T0 + 5).node_by_id.keys() == {"n1", "n2", "old"}


def test_apply_starts_a_job_and_claims_its_gpus(store: BaseStore) -> None:
    live(store, node())
    job = store.submit(spec(gpus=2), T0)
    applied = store.apply(Plan(starts=(start_of(job, ("n1", ["n1-g0", "n1-g1"])),)), T0 + 1)
    assert applied.skipped == () and applied.stopping == ()
    (started,) = applied.started
    got = store.get(job.id)
    assert got == started
    assert (got.state, got.version, got.attempt) == (S.STARTING, 2, 1)
    assert got.allocations == (Allocation("n1", ("n1-g0", "n1-g1"), 0),)
    assert [(a.number, a.started_at, a.ended_at) for a in got.attempts] == [(1, T0 + 1, None)]
    assert got.history[-1].state is S.STARTING and got.history[-1].reason == "Scheduled on n1"
    assert store.allocations(["n1"]) == {"n1": {"n1-g0": owner(job), "n1-g1": owner(job)}}
    assert store.snapshot(T0 + 2).pending == ()
    assert [j.id for j in store.list_jobs(states=[S.STARTING])] == [job.id]


def test_apply_skips_a_start_whose_job_changed(store: BaseStore) -> None:
    live(store, node())
    job = store.submit(spec(), T0)
    plan = Plan(starts=(start_of(job, ("n1", ["n1-g0"])),))
    store.cancel(job.id, T0 + 1)  # version moves on after the snapshot
    applied = store.apply(plan, T0 + 2)
    assert applied.started == ()
    assert applied.skipped == ((job.id, "changed since the snapshot"),)
    assert store.get(job.id).state is S.CANCELLED
    assert store.allocations(["n1"]) == {"n1": {}}


def test_apply_skips_a_start_whose_job_another_process_changed(
        redis_client: Any, redis_prefix: str) -> None:
    """Redis: the scheduler's store applies from the copies its snapshot read; a change made
    by another process after the snapshot (a cancel through the API) fails the commit's
    compare-and-set, and the start is skipped, nothing claimed."""
    from broker.store.redis import RedisStore

    scheduler = RedisStore(redis_client, None, prefix=redis_prefix)
    live(scheduler, node())
    job = scheduler.submit(spec(), T0)
    assert [j.id for j in scheduler.snapshot(T0).pending] == [job.id]
    plan = Plan(starts=(start_of(job, ("n1", ["n1-g0"])),))
    RedisStore(redis_client, None, prefix=redis_prefix).cancel(job.id, T0 + 1)
    applied = scheduler.apply(plan, T0 + 2)
    assert applied.started == () and [s[0] for s in applied.skipped] == [job.id]
    assert scheduler.get(job.id).state is S.CANCELLED
    assert scheduler.allocations(["n1"]) == {"n1": {}}


def test_apply_refuses_a_copy_whose_record_was_rewritten_without_a_new_version(
        redis_client: Any, redis_prefix: str) -> None:
    """Redis: the start is applied to the snapshot's copy, proven by its document's SHA-1 in
    the commit. A record rewritten in place with the same version (what a compromised agent
    can do) refuses the start and writes nothing; the next snapshot reads the record as it is
    now, and the start after it carries that document (for the agent's seal check), never the
    older copy."""
    import json

    from broker.store.redis import RedisStore

    scheduler = RedisStore(redis_client, None, prefix=redis_prefix)
    live(scheduler, node())
    job = scheduler.submit(spec(), T0)
    assert [j.id for j in scheduler.snapshot(T0).pending] == [job.id]
    key = f"{redis_prefix}job:{job.id}"
    raw = json.loads(redis_client.hget(key, "doc"))
    raw["spec"]["command"] = "echo REWRITTEN"
    redis_client.hset(key, "doc", json.dumps(raw))  # the version stays
    plan = Plan(starts=(start_of(job, ("n1", ["n1-g0"])),))
    applied = scheduler.apply(plan, T0 + 1)
    assert applied.started == () and applied.skipped == ((job.id, "changed"),)
    assert scheduler.allocations(["n1"]) == {"n1": {}}
    again = scheduler.snapshot(T0 + 2).pending
    assert [j.spec.command for j in again] == ["echo REWRITTEN"]
    applied = scheduler.apply(Plan(starts=(start_of(again[0], ("n1", ["n1-g0"])),)), T0 + 3)
    assert [j.spec.command for j in applied.started] == ["echo REWRITTEN"]
    stored = json.loads(redis_client.hget(key, "doc"))
    assert stored["spec"]["command"] == "echo REWRITTEN" and stored["state"] == "STARTING"


def test_apply_is_compare_and_set_on_the_version(store: BaseStore) -> None:
    live(store, node())
    job = store.submit(spec(), T0)
    stale = Start(job.id, job.attempt, job.version + 1, (Allocation("n1", ("n1-g0",)),))
    applied = store.apply(Plan(starts=(stale,)), T0 + 1)
    assert applied.started == () and [s[0] for s in applied.skipped] == [job.id]
    assert store.get(job.id).state is S.PENDING


def test_applying_the_same_plan_twice_starts_once(store: BaseStore) -> None:
    live(store, node())
    job = store.submit(spec(), T0)
    plan = Plan(starts=(start_of(job, ("n1", ["n1-g0"])),))
    first, second = store.apply(plan, T0 + 1), store.apply(plan, T0 + 2)
    assert [j.id for j in first.started] == [job.id]
    assert second.started == () and [s[0] for s in second.skipped] == [job.id]
    got = store.get(job.id)
    assert (got.version, len(got.attempts), got.attempts[0].started_at) == (2, 1, T0 + 1)


def test_two_plans_claiming_one_gpu_second_is_busy(store: BaseStore) -> None:
    live(store, node())
    a, b = store.submit(spec(), T0), store.submit(spec(), T0)
    store.apply(Plan(starts=(start_of(a, ("n1", ["n1-g0"])),)), T0 + 1)
    applied = store.apply(Plan(starts=(start_of(b, ("n1", ["n1-g1", "n1-g0"])),)), T0 + 1)
    assert applied.started == () and applied.skipped == ((b.id, "busy"),)
    assert store.get(b.id).state is S.PENDING
    assert store.allocations(["n1"]) == {"n1": {"n1-g0": owner(a)}}  # g1 not half-claimed


def test_one_plan_with_two_starts_on_one_gpu_starts_the_first(store: BaseStore) -> None:
    live(store, node())
    a, b = store.submit(spec(), T0), store.submit(spec(), T0)
    plan = Plan(starts=(start_of(a, ("n1", ["n1-g0"])), start_of(b, ("n1", ["n1-g0"]))))
    applied = store.apply(plan, T0 + 1)
    assert [j.id for j in applied.started] == [a.id]
    assert applied.skipped == ((b.id, "busy"),)


def test_start_on_a_down_or_unknown_node_is_skipped_dead(store: BaseStore) -> None:
    live(store, node("n1"), node("n2"))
    down(store, "n2")
    a, b = store.submit(spec(), T0), store.submit(spec(nodes=2), T0)
    plan = Plan(starts=(start_of(a, ("ghost", ["g0"])),
                        start_of(b, ("n1", ["n1-g0"]), ("n2", ["n2-g0"]))))
    applied = store.apply(plan, T0 + 1)
    assert applied.started == ()
    assert applied.skipped == ((a.id, "dead"), (b.id, "dead"))
    assert store.allocations(["n1", "n2"]) == {"n1": {}, "n2": {}}
    assert store.get(b.id).state is S.PENDING


def test_concurrent_applies_claim_a_gpu_once(store: BaseStore) -> None:
    live(store, node(gpus=1))
    jobs = [store.submit(spec(), T0, job_id=f"j-{i:02d}") for i in range(8)]
    results: list[int] = []
    barrier = threading.Barrier(len(jobs))

    def go(job: Job) -> None:
        barrier.wait()
        applied = store.apply(Plan(starts=(start_of(job, ("n1", ["n1-g0"])),)), T0 + 1)
        results.append(len(applied.started))

    threads = [threading.Thread(target=go, args=(j,)) for j in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert sorted(results) == [0] * 7 + [1]
    starting = store.list_jobs(states=[S.STARTING])
    assert len(starting) == 1
    assert store.allocations(["n1"]) == {"n1": {"n1-g0": owner(starting[0])}}


def test_snapshot_orders_by_submission_time_then_id(store: BaseStore) -> None:
    live(store, node(gpus=4))
    for job_id, t in (("j-c", T0 + 1), ("j-a", T0 + 2), ("j-b", T0 + 1), ("j-d", T0)):
        store.submit(spec(), t, job_id=job_id)
    assert [j.id for j in store.snapshot(T0).pending] == ["j-d", "j-b", "j-c", "j-a"]
    for i, job_id in enumerate(("j-a", "j-d", "j-c")):
        running(store, store.get(job_id), ("n1", [f"n1-g{i}"]))
    assert [j.id for j in store.snapshot(T0).active] == ["j-d", "j-c", "j-a"]
    assert [j.id for j in store.snapshot(T0).pending] == ["j-b"]


def test_commit_primitive_statuses(store: BaseStore) -> None:
    live(store, node("n1"), node("n2"))
    down(store, "n2")
    job = store.submit(spec(), T0, job_id="j-1")
    other = store.submit(spec(), T0, job_id="j-2")
    run = replace(job, state=S.STARTING, version=2)
    g0, g1 = ("n1", "n1-g0"), ("n1", "n1-g1")
    assert store._commit([Change(run, 5, claim=(g0,))]) == ["version"]
    assert store._commit([Change(run, 1, claim=(g0, ("n2", "n2-g0")))]) == ["dead"]
    assert store._commit([Change(run, 1, claim=(("ghost", "x"),))]) == ["dead"]
    assert store._commit([Change(run, 1, claim=(g0,))]) == ["ok"]
    assert store._load(["j-1", "j-x"]) == [run, None]
    # the same owner may claim what it holds; anyone else is refused
    again = replace(run, version=3)
    assert store._commit([Change(again, 2, claim=(g0, g1))]) == ["ok"]
    theirs = replace(other, state=S.STARTING, version=2)
    assert store._commit([Change(theirs, 1, claim=(g1,))]) == ["busy"]
    assert store._load(["j-2"]) == [other]
    # a release only frees GPUs that the named owner still holds
    done = replace(again, version=4)
    assert store._commit([Change(done, 3, release=(g0, g1), release_owner="j-1:9")]) == ["ok"]
    assert store.allocations(["n1"]) == {"n1": {"n1-g0": "j-1:1", "n1-g1": "j-1:1"}}
    final = replace(done, version=5)
    assert store._commit([Change(final, 4, release=(g0,), release_owner="j-1:1")]) == ["ok"]
    assert store.allocations(["n1"]) == {"n1": {"n1-g1": "j-1:1"}}
    assert store._index("active") == ["j-1"] and store._index("pending") == ["j-2"]
    assert store._index("all") == ["j-1", "j-2"]
    # many changes in one call: each is checked on its own, in order
    a = replace(final, version=6)
    statuses = store._commit([Change(a, 5), Change(a, 5), Change(replace(a, version=7), 6)])
    assert statuses == ["ok", "version", "ok"]


# -- reports and fencing ----------------------------------------------------------------------


def test_started_then_exited_zero_succeeds_and_frees_gpus(store: BaseStore) -> None:
    live(store, node())
    job = store.submit(spec(), T0)
    store.apply(Plan(starts=(start_of(job, ("n1", ["n1-g0"])),)), T0 + 1)
    run = store.report(job.id, 1, Started(0, pid=42), T0 + 2)
    assert (run.state, run.started_at, run.version) == (S.RUNNING, T0 + 2, 3)
    assert store.report(job.id, 1, Started(0), T0 + 3) == run  # repeated: no change
    done = store.report(job.id, 1, Exited(0, 0), T0 + 9)
    assert (done.state, done.exit_code, done.finished_at) == (S.SUCCEEDED, 0, T0 + 9)
    assert done.attempts[-1].ended_at == T0 + 9 and done.attempts[-1].outcome == "SUCCEEDED"
    assert store.get(job.id) == done
    assert store.allocations(["n1"]) == {"n1": {}}
    assert store.list_jobs(states=[S.RUNNING, S.STARTING, S.STOPPING]) == []
    assert store.snapshot(T0 + 10).active == ()


def test_gpu_freed_on_exit_can_be_claimed_again(store: BaseStore) -> None:
    live(store, node(gpus=1))
    a, b = store.submit(spec(), T0), store.submit(spec(), T0 + 1)
    running(store, a, ("n1", ["n1-g0"]))
    assert store.apply(Plan(starts=(start_of(b, ("n1", ["n1-g0"])),)), T0 + 2).skipped == (
        (b.id, "busy"),)
    store.report(a.id, 1, Exited(0, 1), T0 + 3)
    b = store.get(b.id)
    assert [j.id for j in store.apply(Plan(starts=(start_of(b, ("n1", ["n1-g0"])),)),
                                      T0 + 4).started] == [b.id]
    assert store.allocations(["n1"]) == {"n1": {"n1-g0": owner(b)}}
    assert store.get(a.id).state is S.FAILED


def test_exit_nonzero_fails_and_start_failed_fails(store: BaseStore) -> None:
    live(store, node())
    a, b = store.submit(spec(), T0), store.submit(spec(), T0)
    running(store, a, ("n1", ["n1-g0"]))
    store.apply(Plan(starts=(start_of(b, ("n1", ["n1-g1"])),)), T0)
    fa = store.report(a.id, 1, Exited(0, 3, "TimeLimit"), T0 + 5)
    assert (fa.state, fa.exit_code, fa.history[-1].reason) == (S.FAILED, 3,
                                                              "TimeLimit (exit 3)")
    fb = store.report(b.id, 1, StartFailed(0, "no such file"), T0 + 5)
    assert (fb.state, fb.exit_code) == (S.FAILED, 127)
    assert "no such file" in fb.history[-1].reason
    assert store.allocations(["n1"]) == {"n1": {}}


def test_reports_for_a_stale_attempt_are_refused(store: BaseStore) -> None:
    live(store, node())
    job = store.submit(spec(), T0)
    with pytest.raises(StaleAttempt):
        store.report(job.id, 1, Started(0), T0)  # still PENDING: nothing to report on
    running(store, job, ("n1", ["n1-g0"]))
    for event in (Started(0), Exited(0, 0)):
        with pytest.raises(StaleAttempt) as err:
            store.report(job.id, 2, event, T0 + 2)
        assert (err.value.attempt, err.value.current) == (2, 1)
    done = store.report(job.id, 1, Exited(0, 0), T0 + 3)
    with pytest.raises(StaleAttempt):
        store.report(job.id, 1, Exited(0, 0), T0 + 4)  # a repeated exit of a finished job
    assert store.get(job.id) == done
    with pytest.raises(StaleAttempt):
        store.check_attempt(job.id, 1)
    with pytest.raises(StaleAttempt):
        store.check_attempt("j-missing", 1)
    with pytest.raises(JobNotFound):
        store.report("j-missing", 1, Started(0), T0)


def test_report_many_is_each_report_in_turn(store: BaseStore) -> None:
    """Batched reports: the same jobs, histories (each step at its own time), refusals and
    usage as calling report() for each in order."""
    live(store, node(gpus=4))
    jobs = [store.submit(spec(team="red", name="t"), T0) for _ in range(4)]
    placed = [store.apply(Plan(starts=(start_of(j, ("n1", [f"n1-g{i}"])),)), T0 + 1)
              .started[0] for i, j in enumerate(jobs)]
    a, b, c, d = placed
    out = store.report_many([
        (a.id, 1, Started(0, pid=7), T0 + 2),
        (a.id, 1, Exited(0, 0), T0 + 5),
        (b.id, 1, Started(0), T0 + 2.5),
        (b.id, 1, Started(0), T0 + 2.6),  # repeated: no change
        (c.id, 2, Started(0), T0 + 3),  # an attempt that does not exist
        (d.id, 1, Exited(0, 3), T0 + 4),  # ended without a Started report
        ("j-missing", 1, Started(0), T0 + 3),
    ])
    assert isinstance(out[4], StaleAttempt) and isinstance(out[6], JobNotFound)
    done_a, run_b, same_b, failed_d = out[1], out[2], out[3], out[5]
    assert isinstance(done_a, Job) and done_a == store.get(a.id) == out[1]
    assert [(h.state, h.time) for h in done_a.history] == [
        (JobState.PENDING, T0), (JobState.STARTING, T0 + 1), (JobState.RUNNING, T0 + 2),
        (JobState.SUCCEEDED, T0 + 5)]
    assert isinstance(out[0], Job) and out[0].state is JobState.RUNNING
    assert run_b == same_b == store.get(b.id) and run_b.state is JobState.RUNNING
    assert store.get(c.id).state is JobState.STARTING
    assert isinstance(failed_d, Job) and failed_d.state is JobState.FAILED
    assert failed_d == store.get(d.id) and failed_d.history[-1].time == T0 + 4
    held = store.allocations(["n1"])["n1"]
    assert held == {"n1-g1": owner(b), "n1-g2": owner(c)}  # a's and d's GPUs released
    assert store.usage(T0 + 5)["red"] == pytest.approx(3.0, rel=1e-3)  # a ran 3 s; d never ran
    assert store.runtimes()[0] == [("red", "t", 1, 0.0, 3.0)]  # a finished on its own
    assert store.report_many([]) == []


def test_report_many_folds_a_gangs_parts_and_retries_a_lost_race(store: BaseStore) -> None:
    live(store, node("n1"), node("n2"))
    job = running(store, store.submit(spec(gpus=1, nodes=2), T0), ("n1", ["n1-g0"]),
                  ("n2", ["n2-g0"]))
    real_commit, calls = store._commit, []

    def racing(changes: Sequence[Change]) -> list[str]:  # someone writes first, once
        calls.append(len(changes))
        if len(calls) == 1:
            store.cancel(job.id, T0 + 3)
        return real_commit(changes)

    store._commit = racing  # type: ignore[method-assign]
    out = store.report_many([(job.id, 1, Exited(0, 0), T0 + 4),
                             (job.id, 1, Exited(1, 0), T0 + 5)])
    assert calls == [1, 1, 1]  # one write for both parts, the cancel's, ours redone
    done = store.get(job.id)
    first = out[0]
    assert isinstance(first, Job) and first.state is JobState.STOPPING
    assert first.parts_exited == ((0, 0),) and out[1] == done
    assert done.state is JobState.CANCELLED and done.parts_exited == ((0, 0), (1, 0))
    assert [h.time for h in done.history][-2:] == [T0 + 3, T0 + 5]
    assert store.allocations(["n1", "n2"]) == {"n1": {}, "n2": {}}


def test_gang_releases_per_part_and_finishes_when_all_exit(store: BaseStore) -> None:
    live(store, node("n1"), node("n2"))
    job = store.submit(spec(gpus=2, nodes=2), T0)
    job = running(store, job, ("n1", ["n1-g0", "n1-g1"]), ("n2", ["n2-g0", "n2-g1"]))
    assert job.state is S.RUNNING
    half = store.report(job.id, 1, Exited(1, 0), T0 + 5)
    assert (half.state, half.parts_exited) == (S.RUNNING, ((1, 0),))
    assert store.allocations(["n1", "n2"]) == {
        "n1": {"n1-g0": owner(job), "n1-g1": owner(job)}, "n2": {}}
    assert store.report(job.id, 1, Exited(1, 0), T0 + 6) == half  # repeated: idempotent
    done = store.report(job.id, 1, Exited(0, 0), T0 + 7)
    assert (done.state, done.parts_exited, done.exit_code) == (S.SUCCEEDED, ((1, 0), (0, 0)), 0)
    assert store.allocations(["n1", "n2"]) == {"n1": {}, "n2": {}}


def test_a_failing_gang_part_stops_the_job_as_failed(store: BaseStore) -> None:
    live(store, node("n1"), node("n2"))
    job = store.submit(spec(nodes=2), T0)
    job = running(store, job, ("n1", ["n1-g0"]), ("n2", ["n2-g0"]))
    stopping = store.report(job.id, 1, Exited(0, 2), T0 + 5)
    assert (stopping.state, stopping.stop_target) == (S.STOPPING, S.FAILED)
    assert stopping.history[-1].reason == "Part 0 failed (Exited, exit 2)"
    assert store.allocations(["n1", "n2"]) == {"n1": {}, "n2": {"n2-g0": owner(job)}}
    done = store.report(job.id, 1, Exited(1, -15, "Signal"), T0 + 6)
    assert (done.state, done.exit_code) == (S.FAILED, 2)
    assert done.history[-1].reason == "GangPartFailed"
    assert store.allocations(["n1", "n2"]) == {"n1": {}, "n2": {}}


# -- cancel and preempt -----------------------------------------------------------------------


def test_cancel_pending_ends_at_once(store: BaseStore) -> None:
    job = store.submit(spec(), T0)
    got = store.cancel(job.id, T0 + 1, "no longer needed")
    assert (got.state, got.finished_at, got.history[-1].reason) == (
        S.CANCELLED, T0 + 1, "no longer needed")
    assert store.snapshot(T0 + 2).pending == ()
    assert store.cancel(job.id, T0 + 2) == got  # already over: no change
    with pytest.raises(JobNotFound):
        store.cancel("j-missing", T0)


def test_cancel_running_stops_then_cancels_on_exit(store: BaseStore) -> None:
    live(store, node())
    job = running(store, store.submit(spec(), T0), ("n1", ["n1-g0"]))
    stopping = store.cancel(job.id, T0 + 5)
    assert (stopping.state, stopping.stop_target) == (S.STOPPING, S.CANCELLED)
    assert store.cancel(job.id, T0 + 6) == stopping  # repeated cancel
    assert store.allocations(["n1"]) == {"n1": {"n1-g0": owner(job)}}  # held until exit
    assert [j.id for j in store.snapshot(T0 + 6).active] == [job.id]
    done = store.report(job.id, 1, Exited(0, -15, "Signal"), T0 + 7)
    assert (done.state, done.finished_at) == (S.CANCELLED, T0 + 7)
    assert store.allocations(["n1"]) == {"n1": {}}


def test_preempt_stops_then_requeues_with_the_next_attempt(store: BaseStore) -> None:
    live(store, node())
    job = running(store, store.submit(spec(), T0), ("n1", ["n1-g0"]))
    applied = store.apply(Plan(preemptions=(Preempt(job.id, 1, "make room", 30.0),)), T0 + 5)
    assert [(j.id, j.state, j.stop_target) for j in applied.stopping] == [
        (job.id, S.STOPPING, S.PREEMPTED)]
    again = store.apply(Plan(preemptions=(Preempt(job.id, 1, "make room", 30.0),)), T0 + 6)
    assert again.stopping[0].version == applied.stopping[0].version  # no second stop
    stale = store.apply(Plan(preemptions=(Preempt(job.id, 7, "make room", 30.0),)), T0 + 6)
    assert stale.stopping == () and [s[0] for s in stale.skipped] == [job.id]
    back = store.report(job.id, 1, Exited(0, -15, "Preempted"), T0 + 8)
    assert (back.state, back.attempt, back.allocations, back.stop_target) == (
        S.PENDING, 2, (), None)
    assert [h.state for h in back.history][-3:] == [S.STOPPING, S.PREEMPTED, S.PENDING]
    assert back.history[-1].attempt == 2
    assert back.attempts[-1].outcome == "PREEMPTED"
    assert store.allocations(["n1"]) == {"n1": {}}
    assert [j.id for j in store.snapshot(T0 + 9).pending] == [job.id]
    with pytest.raises(StaleAttempt):
        store.report(job.id, 1, Started(0), T0 + 9)
    again = running(store, back, ("n1", ["n1-g1"]), now=T0 + 10)
    assert (again.state, again.attempt, len(again.attempts)) == (S.RUNNING, 2, 2)
    assert store.allocations(["n1"]) == {"n1": {"n1-g1": owner(job, 2)}}


# -- nodes: leases, incarnations --------------------------------------------------------------


def test_heartbeat_registers_and_renews_a_lease(store: BaseStore) -> None:
    assert store.heartbeat(node("n2"), 3.0, T0) == []
    assert store.heartbeat(node("n1"), 3.0, T0) == []
    assert store.heartbeat(node("n1"), 3.0, T0 + 2) == []
    nodes = store.nodes()
    assert [(n.id, n.lease_expires, n.state) for n in nodes] == [
        ("n1", T0 + 5, NodeState.READY), ("n2", T0 + 3, NodeState.READY)]
    assert nodes[0].gpus == node("n1").gpus and nodes[0].labels == {"rack": "r1"}
    drained = store.set_node_state("n1", NodeState.DRAINING)
    assert drained.state is NodeState.DRAINING
    assert {n.id: n.state for n in store.nodes()}["n1"] is NodeState.DRAINING
    assert store.allocations() == {"n1": {}, "n2": {}}


def test_nodes_keep_their_first_registration_order(store: BaseStore) -> None:
    for node_id in ("n3", "n1", "n2"):
        live(store, node(node_id))
    live(store, node("n1", incarnation="i2"), now=T0 + 1)  # renewals keep the place
    down(store, "n3")
    assert [n.id for n in store._load_nodes()] == ["n3", "n1", "n2"]
    assert list(store.allocations()) == ["n3", "n1", "n2"]
    assert [n.id for n in store.nodes()] == ["n1", "n2", "n3"]


def test_expire_requeues_the_jobs_of_a_lapsed_node(store: BaseStore) -> None:
    live(store, node("n1"), ttl=10)
    live(store, node("n2"), ttl=100)
    a = running(store, store.submit(spec(), T0), ("n1", ["n1-g0"]))
    b = running(store, store.submit(spec(), T0), ("n2", ["n2-g0"]))
    gang = running(store, store.submit(spec(nodes=2), T0), ("n1", ["n1-g1"]),
                   ("n2", ["n2-g1"]))
    assert store.expire(T0 + 5) == []
    requeued = store.expire(T0 + 11)
    assert sorted(j.id for j in requeued) == sorted([a.id, gang.id])
    for j in requeued:
        assert (j.state, j.attempt, j.allocations) == (S.PENDING, 2, ())
        assert [h.state for h in j.history][-2:] == [S.LOST, S.PENDING]
        assert j.history[-2].reason == "Node n1 lease expired"
    assert store.get(b.id).state is S.RUNNING
    assert store.allocations(["n1", "n2"]) == {"n1": {}, "n2": {"n2-g0": owner(b)}}
    assert {n.id: n.state for n in store.nodes()} == {"n1": NodeState.DOWN,
                                                      "n2": NodeState.READY}
    assert [n.id for n in store.snapshot(T0 + 11).nodes] == ["n2"]
    assert store.expire(T0 + 12) == []  # already DOWN
    with pytest.raises(StaleAttempt):
        store.report(a.id, 1, Exited(0, 0), T0 + 12)  # the old attempt is fenced off


def test_heartbeat_with_a_new_incarnation_requeues_old_jobs(store: BaseStore) -> None:
    live(store, node("n1", incarnation="boot-1"))
    job = running(store, store.submit(spec(), T0), ("n1", ["n1-g0"]))
    assert store.heartbeat(node("n1", incarnation="boot-1"), 10, T0 + 1) == []
    lost = store.heartbeat(node("n1", incarnation="boot-2"), 10, T0 + 2)
    assert [(j.id, j.state, j.attempt) for j in lost] == [(job.id, S.PENDING, 2)]
    assert lost[0].history[-2].reason == "Agent restarted"
    (n1,) = store.nodes()
    assert (n1.incarnation, n1.state, n1.lease_expires) == ("boot-2", NodeState.READY, T0 + 12)
    assert store.allocations(["n1"]) == {"n1": {}}
    again = running(store, lost[0], ("n1", ["n1-g0"]), now=T0 + 3)
    assert again.attempt == 2


def test_lost_too_often_fails(store_factory) -> None:  # type: ignore[no-untyped-def]
    store = store_factory(Config(max_attempts=2))
    job = store.submit(spec(), T0)
    for attempt, boot in ((1, "b1"), (2, "b2")):
        live(store, node("n1", incarnation=boot), now=T0 + attempt)
        job = running(store, store.get(job.id), ("n1", ["n1-g0"]), now=T0 + attempt)
        assert job.attempt == attempt
        (job,) = store.heartbeat(node("n1", incarnation=boot + "x"), 10, T0 + attempt + 0.5)
    assert (job.state, job.attempt, job.finished_at) == (S.FAILED, 2, T0 + 2.5)
    assert job.history[-1].reason == "Gave up after 2 lost attempts (max_attempts 2)"
    assert store.snapshot(T0 + 3).pending == ()


def test_preemptions_are_not_losses_and_have_their_own_limit(  # type: ignore[no-untyped-def]
        store_factory) -> None:
    store = store_factory(Config(max_attempts=2, max_preemptions=3))
    live(store, node("n1"))
    job = store.submit(spec(), T0)
    for attempt in (1, 2, 3):  # evicted three times: no loss, but its preemption limit
        job = running(store, store.get(job.id), ("n1", ["n1-g0"]), now=T0 + attempt)
        store.preempt(job.id, attempt, T0 + attempt + 0.1, "room")
        job = store.report(job.id, attempt, Exited(0, 0, STOPPED), T0 + attempt + 0.2)
        assert job.state is (S.PENDING if attempt < 3 else S.FAILED)
    assert job.history[-1].reason == "Gave up after 3 preemptions (max_preemptions 3)"


@pytest.mark.parametrize("free", [EvictionKind.CARBON, EvictionKind.SPOT])
def test_pauses_and_spot_stops_do_not_count_toward_the_limit(  # type: ignore[no-untyped-def]
        store_factory, free: EvictionKind) -> None:
    """A checkpointed job's own pauses through dirty-power peaks (kind carbon) are its plan,
    not evictions it suffers: a multi-week job pauses about twice a day, and one of the 14-day
    carbon runs failed a 16-GPU job after 100 of them. Spot interruptions are the market's: the
    two months of seed 0 failed a month-long job on spot at its 100th eviction. Other kinds
    still count."""
    store = store_factory(Config(max_preemptions=2))
    live(store, node("n1"))
    job = store.submit(spec(), T0)
    kinds = (free, free, free, EvictionKind.PRIORITY, free, EvictionKind.MOVE)
    for attempt, kind in enumerate(kinds, 1):
        job = running(store, store.get(job.id), ("n1", ["n1-g0"]), now=T0 + attempt)
        store.preempt(job.id, attempt, T0 + attempt + 0.1, "pause", kind)
        job = store.report(job.id, attempt, Exited(0, 0, STOPPED), T0 + attempt + 0.2)
        assert job.state is (S.PENDING if attempt < len(kinds) else S.FAILED), attempt
    assert job.history[-1].reason == "Gave up after 2 preemptions (max_preemptions 2)"


def test_mark_down_checks_the_incarnation(store: BaseStore) -> None:
    live(store, node("n1", incarnation="a"))
    job = running(store, store.submit(spec(), T0), ("n1", ["n1-g0"]))
    assert store._mark_down("n1", "other", 1e300) is False
    assert store.allocations(["n1"]) == {"n1": {"n1-g0": owner(job)}}
    assert store._mark_down("ghost", "a", 1e300) is False
    assert store._mark_down("n1", "a", 1e300) is True
    assert store.allocations(["n1"]) == {"n1": {}}
    assert store.nodes()[0].state is NodeState.DOWN


# -- logs -------------------------------------------------------------------------------------


def test_logs_append_read_and_cursor(store: BaseStore) -> None:
    live(store, node())
    job = running(store, store.submit(spec(), T0), ("n1", ["n1-g0"]))
    store.append_logs(job.id, 1, [("out", "step 1"), ("err", "warn ü")], T0 + 2)
    store.append_logs(job.id, 1, [("out", "step 2")], T0 + 3)
    store.append_logs(job.id, 1, [], T0 + 3)
    lines = store.read_logs(job.id, 1)
    assert [(x.time, x.stream, x.text) for x in lines] == [
        (T0 + 2, "out", "step 1"), (T0 + 2, "err", "warn ü"), (T0 + 3, "out", "step 2")]
    assert len({x.cursor for x in lines}) == 3
    assert [x.text for x in store.read_logs(job.id, 1, cursor=lines[0].cursor)] == [
        "warn ü", "step 2"]
    assert store.read_logs(job.id, 1, cursor=lines[-1].cursor) == []
    assert [x.text for x in store.read_logs(job.id, 1, limit=2)] == ["step 1", "warn ü"]
    assert store.read_logs(job.id, 2) == [] and store.read_logs("j-none", 1) == []
    store.report(job.id, 1, Exited(0, 0), T0 + 4)
    assert [x.text for x in store.read_logs(job.id, 1)] == ["step 1", "warn ü", "step 2"]


def test_logs_are_fenced_by_attempt_and_state(store: BaseStore) -> None:
    live(store, node())
    job = store.submit(spec(), T0)
    with pytest.raises(StaleAttempt):
        store.append_logs(job.id, 1, [("out", "too early")], T0)
    with pytest.raises(StaleAttempt):
        store.append_logs("j-missing", 1, [("out", "x")], T0)
    job = running(store, job, ("n1", ["n1-g0"]))
    with pytest.raises(StaleAttempt) as err:
        store.append_logs(job.id, 2, [("out", "wrong attempt")], T0)
    assert (err.value.current, err.value.state) == (1, "RUNNING")
    store.append_logs(job.id, 1, [("out", "ok")], T0 + 2)
    store.preempt(job.id, 1, T0 + 3, "room")
    store.append_logs(job.id, 1, [("out", "checkpointing")], T0 + 4)  # STOPPING may log
    store.report(job.id, 1, Exited(0, -15), T0 + 5)
    with pytest.raises(StaleAttempt) as err:
        store.append_logs(job.id, 1, [("out", "late")], T0 + 6)
    assert (err.value.current, err.value.state) == (2, "PENDING")
    assert [x.text for x in store.read_logs(job.id, 1)] == ["ok", "checkpointing"]


def test_blocking_read_returns_a_line_appended_while_waiting(store: BaseStore) -> None:
    live(store, node())
    job = running(store, store.submit(spec(), T0), ("n1", ["n1-g0"]))
    store.append_logs(job.id, 1, [("out", "first")], T0)
    cursor = store.read_logs(job.id, 1)[-1].cursor
    got: list[list[str]] = []
    reading = threading.Event()

    def reader() -> None:
        reading.set()
        got.append([x.text for x in store.read_logs(job.id, 1, cursor=cursor, block_s=10)])

    t = threading.Thread(target=reader, daemon=True)
    t.start()
    assert reading.wait(5)
    time.sleep(0.3)  # the reader is in its blocking read by now
    assert got == [] and t.is_alive()  # still waiting: a read that did not block returned []
    began = time.monotonic()
    store.append_logs(job.id, 1, [("out", "second")], T0 + 1)  # after the wait began
    t.join(15)
    assert got == [["second"]]
    assert time.monotonic() - began < 9  # woken by the append, not by the end of block_s


def test_blocking_read_on_an_empty_log_waits_then_returns_nothing(store: BaseStore) -> None:
    began = time.monotonic()
    assert store.read_logs("j-quiet", 1, block_s=0.3) == []
    assert time.monotonic() - began >= 0.25


# -- reasons ----------------------------------------------------------------------------------


def test_reasons_written_by_apply_and_cleared_when_started(store: BaseStore) -> None:
    live(store, node(gpus=1))
    a, b = store.submit(spec(), T0), store.submit(spec(), T0 + 1)
    why = Reason("Resources", "waiting for 1 GPU(s)")
    store.apply(Plan(pending={a.id: why, b.id: why}), T0 + 2)
    assert store.explain(a.id) == why
    assert store.get(b.id).pending_reason == why
    assert [j.pending_reason for j in store.list_jobs()] == [why, why]
    assert [j.pending_reason for j in store.snapshot(T0 + 2).pending] == [None, None]

    prio = Reason("Priority", "behind a")
    applied = store.apply(Plan(starts=(start_of(a, ("n1", ["n1-g0"])),), pending={b.id: prio}),
                          T0 + 3)
    assert [j.id for j in applied.started] == [a.id]
    assert store.explain(a.id) is None
    assert store.get(a.id).pending_reason is None
    assert store.explain(b.id) == prio
    store.apply(Plan(), T0 + 4)
    assert store.explain(b.id) is None
    with pytest.raises(JobNotFound):
        store.explain("j-missing")


def test_apply_records_the_queue_order_less_the_jobs_it_started(store: BaseStore) -> None:
    assert store.last_order() is None and store.queue_position("j-any") is None
    live(store, node(gpus=1))
    a, b, c = (store.submit(spec(), T0 + i) for i in range(3))
    why = Reason("Resources", "waiting for 1 GPU(s)")
    store.apply(Plan(starts=(start_of(a, ("n1", ["n1-g0"])),), pending={b.id: why, c.id: why},
                     order=(a.id, c.id, b.id)), T0 + 5)
    order = store.last_order()
    assert order is not None and (order.ids, order.total, order.at) == ((c.id, b.id), 2, T0 + 5)
    assert store.queue_position(b.id) == (2, 2, T0 + 5)
    assert store.queue_position(a.id) == (None, 2, T0 + 5)  # it started: no longer queued
    store.apply(Plan(), T0 + 6)  # a cycle that ranked nothing replaces the record
    assert store.queue_position(b.id) == (None, 0, T0 + 6)


def test_the_recorded_order_keeps_the_first_order_cap_ids_and_counts_all(
        store: BaseStore) -> None:
    from broker.store.backend import ORDER_CAP

    ids = tuple(f"j-{i:06d}" for i in range(ORDER_CAP + 5))
    store.apply(Plan(order=ids), T0)
    order = store.last_order()
    assert order is not None and order.total == ORDER_CAP + 5 and order.ids == ids[:ORDER_CAP]
    assert store.queue_position(ids[ORDER_CAP - 1]) == (ORDER_CAP, ORDER_CAP + 5, T0)
    assert store.queue_position(ids[ORDER_CAP]) == (None, ORDER_CAP + 5, T0)


# -- backend specifics ------------------------------------------------------------------------


def test_open_store_picks_the_backend(redis_url: str) -> None:
    assert isinstance(open_store(None, None), MemoryStore)
    assert isinstance(open_store("memory://", Config()), MemoryStore)
    r = open_store(redis_url, Config(max_attempts=3), prefix="sw-test:open:")
    assert isinstance(r, RedisStore) and r.config.max_attempts == 3 and r.prefix == "sw-test:open:"
    assert r.redis.ping()
    r.close()
    with pytest.raises(Exception, match="not supported"):
        open_store("postgres://x", None)


def test_redis_keys_stay_under_the_prefix(redis_client, redis_prefix) -> None:  # type: ignore[no-untyped-def]
    store = RedisStore(redis_client, prefix=redis_prefix)
    other = RedisStore(redis_client, prefix=redis_prefix + "other:")
    live(store, node())
    job = running(store, store.submit(spec(), T0), ("n1", ["n1-g0"]))
    store.append_logs(job.id, 1, [("out", "x")], T0)
    store.apply(Plan(pending={"j-x": Reason("R", "r")}), T0)
    keys = {k.decode() for k in redis_client.scan_iter(match="*", count=1000)
            if k.decode().startswith(redis_prefix)}
    assert keys == {redis_prefix + k for k in (
        f"job:{job.id}", f"spec:{job.id}", "jobs:all", "jobs:active", "nodes", "nodes:seq",
        "node:n1", "alloc:n1", "run:n1", "reasons", "ver:active", "order",
        f"logs:{job.id}:1@n1")}
    assert other.list_jobs() == [] and other.nodes() == []
    assert 0 < redis_client.ttl(f"{redis_prefix}logs:{job.id}:1@n1") <= 7 * 86400
    raw = redis_client.hgetall(f"{redis_prefix}job:{job.id}")
    assert (raw[b"version"], raw[b"state"], raw[b"attempt"]) == (b"3", b"RUNNING", b"1")


def test_set_node_state_drains_but_never_downs(store: BaseStore) -> None:
    live(store, node("n1"))
    assert store.set_node_state("n1", NodeState.DRAINING).state is NodeState.DRAINING
    store.heartbeat(node("n1"), 3.0, T0 + 1)  # the agent's READY does not undo a drain
    assert store.nodes()[0].state is NodeState.DRAINING
    with pytest.raises(ValueError, match="lease expires"):
        store.set_node_state("n1", NodeState.DOWN)
    with pytest.raises(NodeNotFound):
        store.set_node_state("ghost", NodeState.READY)


def test_an_operators_drain_survives_agent_restarts_and_a_down_spell(store: BaseStore) -> None:
    live(store, node("n1", incarnation="boot-1"), ttl=3.0)
    drained = store.set_node_state("n1", NodeState.DRAINING)
    assert (drained.state, drained.drained_by) == (NodeState.DRAINING, "operator")
    store.heartbeat(node("n1", incarnation="boot-2"), 3.0, T0 + 1)  # the agent restarted
    assert (store.nodes()[0].state, store.nodes()[0].drained_by) == (NodeState.DRAINING,
                                                                     "operator")
    assert [n.id for n in store.expire(T0 + 10)] == [] and store.nodes()[0].state is \
        NodeState.DOWN  # its lease ran out
    store.heartbeat(node("n1", incarnation="boot-3"), 3.0, T0 + 11)  # back after a DOWN spell
    assert store.nodes()[0].state is NodeState.DRAINING
    resumed = store.set_node_state("n1", NodeState.READY)
    assert (resumed.state, resumed.drained_by) == (NodeState.READY, "")
    store.heartbeat(node("n1", incarnation="boot-3"), 3.0, T0 + 12)
    assert store.nodes()[0].state is NodeState.READY


def test_an_agents_own_drain_ends_with_its_restart(store: BaseStore) -> None:
    live(store, node("n1", incarnation="boot-1"))
    store.heartbeat(node("n1", incarnation="boot-1", state=NodeState.DRAINING), 3.0, T0 + 1)
    assert store.nodes()[0].state is NodeState.DRAINING  # (SIGTERM: it drains itself)
    store.heartbeat(node("n1", incarnation="boot-2"), 3.0, T0 + 2)
    assert store.nodes()[0].state is NodeState.READY


def test_expire_spares_a_node_that_renewed(store: BaseStore) -> None:
    live(store, node("n1"), ttl=5)
    n = store._load_nodes()[0]
    assert not store._mark_down("n1", n.incarnation, T0 + 1)  # lease still valid at T0 + 1
    assert store.nodes()[0].state is NodeState.READY


def test_submit_many_with_a_taken_id_stores_nothing(store: BaseStore) -> None:
    store.submit(spec(), T0, job_id="j-taken")
    with pytest.raises(Conflict, match="nothing stored"):
        store.submit_many([spec(), spec()], T0, ["j-new", "j-taken"])
    assert [j.id for j in store.list_jobs()] == ["j-taken"]


def test_exit_of_an_unknown_rank_is_ignored(store: BaseStore) -> None:
    live(store, node("n1"))
    job = running(store, store.submit(spec(), T0), ("n1", ["n1-g0"]))
    after = store.report(job.id, job.attempt, Exited(7, 0), T0 + 5)
    assert after.state is S.RUNNING
    assert store.allocations(["n1"]) == {"n1": {"n1-g0": owner(job)}}


@pytest.mark.parametrize(("reason", "final"), [("Stopped", S.PENDING), ("Exited", S.SUCCEEDED)])
def test_preempted_job_exiting_zero(store: BaseStore, reason: str, final: JobState) -> None:
    """Exit 0 after the agent's SIGTERM is a checkpoint (requeue); before it, a real finish."""
    live(store, node("n1"))
    job = running(store, store.submit(spec(), T0), ("n1", ["n1-g0"]))
    store.preempt(job.id, job.attempt, T0 + 5, "make room")
    after = store.report(job.id, job.attempt, Exited(0, 0, reason), T0 + 6)
    assert after.state is final
    assert after.attempt == (2 if final is S.PENDING else 1)


def test_a_start_that_lost_a_race_keeps_a_reason(store: BaseStore) -> None:
    live(store, node("n1", gpus=1))
    a, b = store.submit(spec(), T0), store.submit(spec(), T0)
    store.apply(Plan(starts=(start_of(a, ("n1", ["n1-g0"])),)), T0 + 1)
    store.apply(Plan(starts=(start_of(b, ("n1", ["n1-g0"])),)), T0 + 2)
    reason = store.explain(b.id)
    assert reason is not None and reason.code == "Resources" and "raced" in reason.message


# -- fair-share usage, runtime samples, the reservation -------------------------------------


def test_an_ended_attempt_feeds_usage_and_the_predictor(store: BaseStore) -> None:
    live(store, node())
    ok = running(store, store.submit(spec(gpus=2, team="red", name="t", time_limit=3600), T0),
                 ("n1", ["n1-g0", "n1-g1"]))
    store.report(ok.id, 1, Exited(0, 0), T0 + 101)  # ran 100 s on 2 GPUs
    bad = running(store, store.submit(spec(gpus=1, team="blue"), T0), ("n1", ["n1-g0"]),
                  now=T0 + 200)
    store.report(bad.id, 1, Exited(0, 3), T0 + 251)  # failed after 50 s: usage, no sample
    snap = store.snapshot(T0 + 251)
    assert snap.usage["red"] == pytest.approx(200.0, rel=1e-3)
    assert snap.usage["blue"] == pytest.approx(50.0, rel=1e-3)
    assert snap.predictor is None  # the store keeps no scheduling state
    samples, cursor = store.runtimes()
    assert samples == [("red", "t", 2, 3600.0, 100.0)]
    assert store.runtimes(cursor) == ([], cursor)
    builder = SnapshotBuilder(store)  # a scheduler's: it keeps the predictor and feeds it
    built = builder.build(T0 + 251)
    assert built.predictor is builder.predictor and builder.predictor.observed == 1
    assert builder.build(T0 + 252).predictor.observed == 1  # each runtime once
    assert SnapshotBuilder(store).build(T0 + 253).predictor.observed == 1  # a new scheduler
    half_life = store.config.fairshare_half_life_s
    assert store.usage(T0 + 101 + half_life)["red"] == pytest.approx(100.0, rel=1e-3)


def test_the_reservation_survives_from_one_cycle_to_the_next(store: BaseStore) -> None:
    from broker.cycle.plan import Reservation

    live(store, node())
    res = Reservation("j-x", T0 + 60, ("n1",), "A100-80GB", scavengers=("j-y",))
    store.apply(Plan(reservation=res), T0)
    assert store.snapshot(T0 + 1).reservation == res
    assert store.reservation() == res
    store.apply(Plan(), T0 + 2)
    assert store.snapshot(T0 + 3).reservation is None
    assert store.reservation() is None


# -- leadership and fencing -----------------------------------------------------------------


def test_one_scheduler_leads_and_its_token_grows_with_each_leadership(store: BaseStore) -> None:
    a = store.acquire_leadership("sched-a", 30.0, T0)
    assert a is not None and a.endswith(":sched-a")
    assert store.acquire_leadership("sched-b", 30.0, T0) is None  # a leads
    assert store.acquire_leadership("sched-a", 30.0, T0 + 1) == a  # re-acquiring renews
    assert store.renew_leadership(a, 30.0, T0 + 2)
    held = store.leader(T0 + 2)
    assert held is not None and held[0] == a and 0 < held[1] <= 30.0
    store.release_leadership(a)
    assert store.leader(T0 + 2) is None
    assert not store.renew_leadership(a, 30.0, T0 + 3)  # that leadership has ended
    b = store.acquire_leadership("sched-b", 30.0, T0 + 3)
    assert b is not None and int(b.split(":")[0]) > int(a.split(":")[0])


def test_a_lease_that_is_not_renewed_runs_out(store: BaseStore) -> None:
    a = store.acquire_leadership("sched-a", 0.2, T0)
    assert a is not None
    # (the memory store judges leases by the now it is given, Redis by its own clock)
    b = poll_until(lambda: store.acquire_leadership("sched-b", 30.0, T0 + 10), 5.0,
                   "the lease to run out")
    assert b != a and not store.renew_leadership(a, 30.0, T0 + 10)


def test_a_former_leaders_writes_are_fenced(store: BaseStore) -> None:
    live(store, node())
    job = store.submit(spec(gpus=1), T0)
    old = store.acquire_leadership("sched-a", 30.0, T0)
    assert old is not None
    store.release_leadership(old)  # (as if its lease had run out while it was paused)
    new = store.acquire_leadership("sched-b", 30.0, T0 + 1)
    assert new is not None
    plan = Plan(starts=(start_of(job, ("n1", ["n1-g0"])),))
    with store.fenced(old), pytest.raises(Fenced, match="has ended"):
        store.apply(plan, T0 + 2)
    with store.fenced(old), pytest.raises(Fenced):
        store.cancel(job.id, T0 + 2)
    assert store.get(job.id).state is JobState.PENDING  # nothing of it landed
    assert store.allocations()["n1"] == {}
    with store.fenced(new):
        assert [j.id for j in store.apply(plan, T0 + 3).started] == [job.id]
    assert store.fence_token() is None  # only inside the block
    store.cancel(job.id, T0 + 4)  # writes outside a leader's block are not fenced


# -- retention and paging -------------------------------------------------------------------


def test_finished_jobs_leave_the_hot_keys_and_show_still_reads_them(  # type: ignore[no-untyped-def]
        store_factory) -> None:
    store = store_factory(Config(retain_finished_s=100.0))
    live(store, node())
    done = running(store, store.submit(spec(name="old"), T0), ("n1", ["n1-g0"]))
    done = store.report(done.id, 1, Exited(0, 0), T0 + 5)
    fresh = running(store, store.submit(spec(name="new"), T0 + 50), ("n1", ["n1-g0"]),
                    now=T0 + 50)
    fresh = store.report(fresh.id, 1, Exited(0, 0), T0 + 60)
    waiting = store.submit(spec(name="waiting"), T0 + 1)
    assert store.archive_finished(T0 + 104) == 0  # finished 99 s ago: kept
    assert store.archive_finished(T0 + 106) == 1
    assert [j.id for j in store.list_jobs()] == [waiting.id, fresh.id]
    assert done.id not in store.list_ids("all")
    shown = store.get(done.id)  # from the archive, whole
    assert (shown.state, shown.history, shown.attempts) == (S.SUCCEEDED, done.history,
                                                            done.attempts)
    assert store.archive_finished(T0 + 106) == 0  # nothing twice
    with pytest.raises(JobNotFound):
        store.get("j-nothere")


def test_retention_off_keeps_every_job(store_factory) -> None:  # type: ignore[no-untyped-def]
    store = store_factory(Config(retain_finished_s=0))
    job = store.submit(spec(), T0)
    store.cancel(job.id, T0 + 1)
    assert store.archive_finished(T0 + 10**9) == 0
    assert [j.id for j in store.list_jobs()] == [job.id]


def test_list_jobs_pages_back_newest_first(store: BaseStore) -> None:
    ids = [store.submit(spec(), T0 + i).id for i in range(7)]
    assert [j.id for j in store.list_jobs(limit=3)] == ids[4:]
    assert [j.id for j in store.list_jobs(limit=3, skip=3)] == ids[1:4]
    assert [j.id for j in store.list_jobs(limit=3, skip=6)] == ids[:1]
    assert store.list_jobs(limit=3, skip=7) == []
    pending = [j.id for j in store.list_jobs({S.PENDING}, limit=2, skip=1)]
    assert pending == ids[4:6]
