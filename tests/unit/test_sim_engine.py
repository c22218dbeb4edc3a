"""The simulator (broker/sim/engine.py) on a tiny cluster and hand-written traces: every policy
finishes every feasible job without breaking an invariant, and the policies differ where they
should (backfill, preemption)."""

from __future__ import annotations

from functools import cache

import pytest

from broker.config.core import Config
from broker.model import Job
from broker.model.state import JobState
from broker.sim.cluster import Cluster, cluster_from_data
from broker.sim.engine import Simulation
from broker.sim.types import JobRecord, SimResult, Trace, TraceJob

POLICIES = ("fcfs", "slurm-like", "spillway")


def tiny() -> Cluster:
    """2 nodes x 4 A100s."""
    return cluster_from_data({"name": "tiny", "nodes": [
        {"prefix": "n", "count": 2, "gpus": "4xA100-80GB"}]})


def tj(job_id: str, submit: float, duration: float, gpus: int = 1, *, nodes: int = 1,
       team: str = "vision", priority: str = "normal", limit: float | None = None) -> TraceJob:
    return TraceJob(id=job_id, submit_s=submit, duration_s=duration, gpus=gpus, nodes=nodes,
                    team=team, priority=priority,
                    time_limit_s=limit if limit is not None else 2 * duration)


def trace(*jobs: TraceJob, name: str = "hand") -> Trace:
    return Trace(name, 0.0, tuple(sorted(jobs, key=lambda j: (j.submit_s, j.id))))


# 20 jobs: two teams, three classes, 1-4 GPUs, one 2-node gang, bursts that queue
MIXED = trace(
    tj("j00", 0, 600, 4, team="vision"),
    tj("j01", 0, 300, 2, team="nlp"),
    tj("j02", 10, 900, 2, team="nlp", priority="low"),
    tj("j03", 20, 120, 1, team="vision"),
    tj("j04", 30, 1800, 4, team="nlp"),
    tj("j05", 40, 60, 1, team="vision", priority="high"),
    tj("j06", 50, 400, 4, nodes=2, team="vision"),
    tj("j07", 60, 240, 1, team="nlp", priority="low"),
    tj("j08", 120, 700, 2, team="vision"),
    tj("j09", 200, 100, 1, team="nlp"),
    tj("j10", 300, 1500, 3, team="vision", priority="low"),
    tj("j11", 400, 200, 1, team="nlp", priority="high"),
    tj("j12", 500, 800, 4, team="nlp"),
    tj("j13", 600, 50, 1, team="vision"),
    tj("j14", 700, 1000, 2, team="vision"),
    tj("j15", 800, 300, 1, team="nlp", priority="low"),
    tj("j16", 900, 450, 2, team="nlp"),
    tj("j17", 1000, 90, 1, team="vision", priority="high"),
    tj("j18", 1100, 2400, 4, team="vision", priority="low"),
    tj("j19", 1200, 150, 1, team="nlp"),
)

TOO_WIDE = tj("wide", 5, 100, 8)  # 8 GPUs on one node: no node has them


@cache
def run(policy: str, which: str = "mixed") -> tuple[SimResult, Simulation]:
    tr = {"mixed": MIXED, "wide": trace(*MIXED.jobs, TOO_WIDE), "backfill": BACKFILL,
          "preempt": PREEMPT, "limit": LIMIT, "defrag": DEFRAG}[which]
    sim = Simulation(tiny(), tr, policy)
    return sim.run(), sim


def records(result: SimResult) -> dict[str, JobRecord]:
    return {r.id: r for r in result.records}


# -- every policy, the whole trace ---------------------------------------------------------------

@pytest.mark.parametrize("policy", POLICIES)
def test_every_job_finishes_without_violations(policy: str) -> None:
    result, _ = run(policy)
    m = result.metrics
    assert m["invariant_violations"] == 0, m.get("invariant_examples")
    assert (m["policy"], m["capacity_gpus"]) == (policy, 8)
    assert (m["jobs"], m["finished"], m["started"]) == (20, 20, 20)
    assert (m["infeasible"], m["unfinished"]) == (0, 0)
    assert 0.0 < m["utilization"] <= 1.0
    assert 0.0 < m["busy_utilization"] <= 1.0
    for r in result.records:
        assert r.first_start_s is not None and r.end_s is not None
        assert r.first_start_s >= r.submit_s
        assert r.end_s - r.first_start_s >= r.duration_s - 1e-6  # never faster than needed


@pytest.mark.parametrize("policy", POLICIES)
def test_busy_gpus_never_exceed_the_cluster(policy: str) -> None:
    result, _ = run(policy)
    assert result.samples
    assert all(0 <= s.busy_gpus <= 8 for s in result.samples)
    assert result.samples[-1].busy_gpus == 0 and result.samples[-1].queued_jobs == 0


@pytest.mark.parametrize("policy", POLICIES)
def test_a_job_wider_than_the_cluster_is_infeasible_and_left_out(policy: str) -> None:
    result, _ = run(policy, "wide")
    m = result.metrics
    assert (m["jobs"], m["infeasible"], m["finished"], m["unfinished"]) == (21, 1, 20, 0)
    assert m["invariant_violations"] == 0
    wide = records(result)["wide"]
    assert wide.infeasible and wide.first_start_s is None and wide.end_s is None
    # left out of every statistic: the same waits as without it
    assert m["wait_mean_s"] == run(policy)[0].metrics["wait_mean_s"]


def test_fcfs_starts_jobs_in_submit_order() -> None:
    result, _ = run("fcfs")
    by_submit = sorted(result.records, key=lambda r: (r.submit_s, r.id))
    starts = [r.first_start_s for r in by_submit]
    assert starts == sorted(starts)  # type: ignore[type-var]


@pytest.mark.parametrize("policy", ["slurm-like", "spillway"])
def test_the_other_policies_do_reorder(policy: str) -> None:
    """The mixed trace is not trivially ordered: classes and backfill change the start order."""
    result, _ = run(policy)
    by_submit = sorted(result.records, key=lambda r: (r.submit_s, r.id))
    starts = [r.first_start_s for r in by_submit]
    assert starts != sorted(starts)  # type: ignore[type-var]


# -- backfill --------------------------------------------------------------------------------

# A 4-GPU job holds one node until t=1000; a 2-node gang waits for it; short 1-GPU jobs could
# run on the other node meanwhile (EASY backfill) or wait behind the gang (fcfs).
BACKFILL = trace(
    tj("hold", 0, 1000, 4, limit=1000),
    tj("gang", 1, 100, 4, nodes=2, limit=200),
    *(tj(f"short{i}", 2 + i, 100, 1, limit=200) for i in range(4)),
)


def test_backfill_lowers_the_mean_wait() -> None:
    fcfs, _ = run("fcfs", "backfill")
    slurm, _ = run("slurm-like", "backfill")
    assert slurm.metrics["wait_mean_s"] < fcfs.metrics["wait_mean_s"]
    f, s = records(fcfs), records(slurm)
    for i in range(4):
        assert f[f"short{i}"].first_start_s >= f["gang"].first_start_s  # type: ignore[operator]
        assert s[f"short{i}"].first_start_s == s[f"short{i}"].submit_s  # backfilled at once
    # ... without delaying the gang's reservation
    assert s["gang"].first_start_s == f["gang"].first_start_s == 1000.0
    for result in (fcfs, slurm):
        assert result.metrics["invariant_violations"] == 0
        assert result.metrics["finished"] == 6


# -- preemption ------------------------------------------------------------------------------

# Two long normal jobs fill the cluster; a critical job arrives after min_runtime_s.
PREEMPT = trace(
    tj("long1", 0, 5000, 4, team="nlp", limit=6000),
    tj("long2", 0, 5000, 4, team="nlp", limit=6000),
    tj("crit", 1000, 100, 4, team="vision", priority="critical", limit=200),
)


def test_critical_job_preempts_under_spillway() -> None:
    result, _ = run("spillway", "preempt")
    m = result.metrics
    assert m["preemptions"] >= 1
    assert m["gpu_hours_lost_to_preemption"] > 0
    assert (m["finished"], m["unfinished"], m["invariant_violations"]) == (3, 0, 0)
    recs = records(result)
    assert recs["crit"].first_start_s is not None
    assert recs["crit"].first_start_s - 1000 <= 60  # within its 5-minute SLA
    victims = [r for r in recs.values() if r.preemptions]
    assert victims and all(r.id.startswith("long") and r.end_s is not None for r in victims)
    assert all(r.lost_gpu_s > 0 for r in victims)
    # a checkpointing victim resumes: it ends later than it would have, but not from scratch
    for r in victims:
        assert r.end_s > 5000  # type: ignore[operator]
        assert r.end_s < 5000 + 5000  # type: ignore[operator]


def test_a_victim_that_gives_up_leaves_the_queue_and_is_counted() -> None:
    """A job evicted ``max_preemptions`` times fails: ``jobs_failed`` counts it, and the queue
    no longer holds it (it waits for nothing: counted as queued, it made every later idle
    GPU count against ``busy_utilization``)."""
    result = Simulation(tiny(), PREEMPT, "spillway", config=Config(max_preemptions=1)).run()
    m = result.metrics
    assert (m["jobs_failed"], m["unfinished"], m["finished"]) == (1, 1, 2)
    assert [r.id[:4] for r in result.records if r.failed] == ["long"]
    assert result.samples[-1].queued_jobs == 0


def test_critical_job_waits_under_slurm_like() -> None:
    result, _ = run("slurm-like", "preempt")
    m = result.metrics
    assert m["preemptions"] == 0
    assert m["gpu_hours_lost_to_preemption"] == 0
    assert (m["finished"], m["invariant_violations"]) == (3, 0)
    assert records(result)["crit"].first_start_s == 5000.0


# -- time limits -----------------------------------------------------------------------------

LIMIT = trace(
    tj("overruns", 0, 1000, 2, limit=500),
    tj("fits", 0, 300, 2, limit=300),
    tj("after", 10, 100, 4, limit=200),
)


@pytest.mark.parametrize("policy", POLICIES)
def test_a_job_is_stopped_at_its_time_limit(policy: str) -> None:
    result, sim = run(policy, "limit")
    recs = records(result)
    over, fits = recs["overruns"], recs["fits"]
    assert over.end_s is not None and over.first_start_s is not None
    assert over.end_s - over.first_start_s == pytest.approx(500.0)
    assert sim.store.get("overruns").state is JobState.FAILED
    assert fits.end_s - fits.first_start_s == pytest.approx(300.0)  # type: ignore[operator]
    assert sim.store.get("fits").state is JobState.SUCCEEDED
    assert result.metrics["invariant_violations"] == 0
    assert result.metrics["finished"] == 3


# A and B share node n-00 (C fills n-01); A started at t=0, B at t=300. Simulated jobs
# checkpoint, so both lose only the grace period: the youngest (B) is the documented victim.
ZERO_START = trace(
    tj("A", 0, 5000, 2, limit=6000), tj("C", 0, 5000, 4, limit=6000),
    tj("B", 300, 5000, 2, limit=6000),
    tj("crit", 1000, 100, 2, priority="critical", limit=200),
)


def test_the_youngest_victim_even_against_a_job_started_at_time_zero() -> None:
    sim = Simulation(tiny(), ZERO_START, "spillway")
    result = sim.run()
    assert {a.allocations[0].node_id for a in (sim.store.get("A").attempts[0],
                                                sim.store.get("B").attempts[0])} == {"n-00"}
    assert {r.id for r in result.records if r.preemptions} == {"B"}


# -- defragmentation -------------------------------------------------------------------------

# a and b (3 GPUs) take a node each; l1 and l2 (1 GPU, long) fill the last GPU of each; once a
# and b end, 6 GPUs are free but no node has 4: W can start only if a long job moves
DEFRAG = trace(
    tj("a", 0, 700, 3, limit=1400),
    tj("b", 0, 700, 3, limit=1400),
    tj("l1", 1, 20_000, 1, limit=40_000),
    tj("l2", 1, 20_000, 1, limit=40_000),
    tj("W", 1500, 100, 4, limit=200),
)


def test_spillway_moves_a_small_job_to_start_a_wide_one() -> None:
    result, _ = run("spillway", "defrag")
    m = result.metrics
    assert (m["finished"], m["unfinished"], m["invariant_violations"]) == (5, 0, 0)
    assert m["defrag_moves"] == m["preemptions"] == 1
    recs = records(result)
    assert recs["W"].first_start_s is not None
    assert recs["W"].first_start_s - 1500 <= 60  # the move's grace period, not hours
    moved = [r for r in recs.values() if r.moves]
    assert [r.id for r in moved] == ["l1"]  # victim order: same age, then id
    assert recs["l1"].preemptions == 1 and recs["l1"].lost_gpu_s > 0
    # it checkpointed and resumed: it ends about a grace period later than l2
    assert 0 < recs["l1"].end_s - recs["l2"].end_s <= 60  # type: ignore[operator]


def test_slurm_like_waits_for_the_long_jobs_instead() -> None:
    result, _ = run("slurm-like", "defrag")
    m = result.metrics
    assert (m["preemptions"], m["defrag_moves"], m["invariant_violations"]) == (0, 0, 0)
    recs = records(result)
    assert recs["W"].first_start_s is not None and recs["W"].first_start_s >= 20_000


# -- relief ------------------------------------------------------------------------------------

# eight 1-GPU jobs of 20 000 s fill both nodes; W, 4 GPUs for 100 s, arrives at 1 000 s: EASY
# would reserve it a node at 20 000 s (a slowdown of 190); relief evicts one node's four jobs,
# which checkpoint, and restart as soon as W is done
RELIEF = trace(*(tj(f"l{i}", 0, 20_000, 1, limit=40_000) for i in range(8)),
               tj("W", 1000, 100, 4, limit=200))


def relief_cluster(**settings: float) -> Cluster:
    return cluster_from_data({"name": "tiny", "nodes": [
        {"prefix": "n", "count": 2, "gpus": "4xA100-80GB"}],
        "settings": {"relief": settings}})


def test_spillway_relief_lets_a_starved_short_job_evict_long_ones() -> None:
    result = Simulation(relief_cluster(relief_slowdown=20.0), RELIEF, "spillway").run()
    m = result.metrics
    assert (m["finished"], m["unfinished"], m["invariant_violations"]) == (9, 0, 0)
    assert m["relief_evictions"] == m["preemptions"] == 4
    recs = records(result)
    assert recs["W"].first_start_s is not None
    assert recs["W"].first_start_s - 1000 <= 60  # a grace period, not 19 000 s
    yielded = sorted(r.id for r in recs.values() if r.yields)
    assert len(yielded) == 4
    spared = [r for r in recs.values() if r.id.startswith("l") and not r.yields]
    for r in recs.values():
        if r.yields:  # checkpointed, resumed right after W: about W's runtime and a grace late
            assert r.lost_gpu_s > 0
            assert 100 <= r.end_s - spared[0].end_s <= 100 + 2 * 60  # type: ignore[operator]


def test_without_relief_the_short_job_waits_for_the_long_ones() -> None:
    result = Simulation(relief_cluster(relief_slowdown=0.0), RELIEF, "spillway").run()
    m = result.metrics
    assert (m["preemptions"], m["relief_evictions"], m["invariant_violations"]) == (0, 0, 0)
    recs = records(result)
    assert recs["W"].first_start_s is not None and recs["W"].first_start_s >= 20_000


# -- strict FIFO skips cycles that cannot start anything ----------------------------------------

def _backlog(n: int = 120, seed: int = 7) -> Trace:
    """A seeded stream of 1-4 GPU jobs (a tenth of them 2-node gangs) arriving faster than they
    finish."""
    import random

    rng = random.Random(seed)
    jobs, t = [], 0.0
    for i in range(n):
        t += rng.choice((0.0, 5.0, 30.0, 90.0))
        gpus = rng.choice((1, 1, 2, 4, 4))
        nodes = 2 if rng.random() < 0.1 else 1
        jobs.append(tj(f"b{i:03d}", t, rng.choice((60.0, 300.0, 900.0, 2400.0)), gpus,
                       nodes=nodes, team=rng.choice(("vision", "nlp"))))
    return trace(*jobs, name="backlog")


def test_fcfs_skips_arrival_cycles_behind_a_blocked_head_with_the_same_outcome() -> None:
    tr = _backlog()
    fast = Simulation(tiny(), tr, "fcfs")
    slow = Simulation(tiny(), tr, "fcfs")
    slow.skip_until_event = False  # a cycle on every arrival, as for any other policy
    a, b = fast.run(), slow.run()
    assert a.metrics["invariant_violations"] == b.metrics["invariant_violations"] == 0
    assert a.metrics["finished"] == b.metrics["finished"] == 120
    assert [(r.id, r.first_start_s, r.end_s) for r in a.records] == \
        [(r.id, r.first_start_s, r.end_s) for r in b.records]
    assert fast.cycles < slow.cycles  # the skip did happen


def test_oracle_runtimes_give_every_estimate_as_the_true_runtime() -> None:
    """``--oracle-runtimes``: the policies see each job's true runtime, queued or running."""
    sim = Simulation(tiny(), MIXED, "spillway", oracle_runtimes=True)
    oracle = sim.snapshots.predictor
    seen: list[tuple[str, int, float]] = []
    inner = oracle.estimate

    def recording(job: Job, quantile: float | None = None) -> float:
        est = inner(job, quantile)
        seen.append((job.id, job.attempt, est))
        return est

    oracle.estimate = recording  # type: ignore[method-assign]
    result = sim.run()
    assert result.metrics["invariant_violations"] == 0
    assert all(r.end_s is not None for r in result.records)
    duration = {j.id: j.duration_s for j in MIXED.jobs}
    firsts = [(job_id, est) for job_id, attempt, est in seen if attempt == 1]
    assert len({job_id for job_id, _ in firsts}) >= 15  # asked about most jobs
    assert all(est == pytest.approx(duration[job_id]) for job_id, est in firsts)
