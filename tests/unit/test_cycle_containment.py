"""A cycle never dies of one job (issue 36): a policy that raises while deciding about one job
sets that job aside, with a ``PolicyError`` reason naming the policy and the exception, and the
cycle plans the others exactly as if the job were not there. A failure that is not one job's
(a broken setting) still fails the cycle.

One row per role the cycle calls: a shipped policy's per-job step is made to raise for job
``bad`` (or a test policy registered for the role does), on a small cluster where the other
jobs start, wait, preempt, burst or defer.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

import pytest

import policies.burst.budget
import policies.burst.sla
import policies.carbon.defer
import policies.evict.priority
import policies.order.orderings
from broker.cycle.plan import Plan, Snapshot
from broker.cycle.scheduler import MAX_PASSES, run_cycle
from broker.errors import CycleFailed
from broker.model import Allocation, Job
from policies import registry
from policies.place.backfill import Easy
from policies.place.placement import BestFit
from policies.registry import BUNDLES, PolicySet
from tests.builders import node
from tests.unit.test_burst import OD, SPOT, late
from tests.unit.test_preemption import NOW, pending, running, snap

BAD = "bad"


class Boom(Exception):
    """What the broken policies raise for job ``bad``."""


def _boom(job: Job) -> None:
    if job.id == BAD:
        raise Boom(f"no rule for {job.id}")


def breaking(fn: Callable[..., Any], job_arg: int = 1) -> Callable[..., Any]:
    """``fn``, raising Boom first when its argument ``job_arg`` is job ``bad``."""
    def wrapped(*args: Any, **kw: Any) -> Any:
        _boom(args[job_arg])
        return fn(*args, **kw)
    return wrapped


@pytest.fixture
def registered(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[str, str, Any], None]]:
    """Register a policy for one test (the registry and its code map as they were after)."""
    def add(role: str, name: str, obj: Any) -> None:
        monkeypatch.setitem(registry._REGISTRY[role], name, obj)
        registry._codes.cache_clear()
    yield add
    registry._codes.cache_clear()


class BadPlace(BestFit):
    def place(self, cycle: Any, job: Job, end: float) -> tuple[Allocation, ...] | None:
        _boom(job)
        return super().place(cycle, job, end)


class BadReserve(Easy):
    def reserve(self, cycle: Any, job: Job, profile: Any) -> Any:
        _boom(job)
        return super().reserve(cycle, job, profile)


def _bad_admit(cycle: Any, job: Job) -> str | None:
    _boom(job)
    return None


def _bad_estimate(snapshot: Snapshot) -> Callable[[Job], float]:
    def estimate(job: Job) -> float:
        _boom(job)
        return job.spec.time_limit or float("inf")
    return estimate


H = 3600.0


def _queue(bad_gpus: int = 2, **bad: Any) -> list[Job]:
    """Three jobs: one GPU, the bad one, and a CPU-only one (0 GPUs, 2 CPUs)."""
    return [pending("one", 1, priority="normal", time_limit=H),
            pending(BAD, bad_gpus, **{"priority": "normal", "time_limit": H, **bad}),
            pending("cpu", 0, priority="normal", cpus=2.0, memory_gb=3.5, time_limit=H)]


def _host() -> Any:
    return node("a", 8, cpus=64, memory_gb=512)


# role -> (policies, the patch, the snapshot, what the others do)
def _rows() -> dict[str, tuple[PolicySet, Callable[[pytest.MonkeyPatch, Any], None],
                             Snapshot]]:
    idle = snap([_host()], _queue(), [])
    six = running("r", 6, time_limit=20 * H)  # 2 of 8 GPUs free: the bad job (4) waits
    busy = snap([_host()], _queue(bad_gpus=4), [six])
    full = [running("v", 8, priority="low", time_limit=20 * H)]
    preempt = snap([_host()], [pending(BAD, 4), pending("crit", 2)], full)
    burst = snap([node("a", 4)], [late(BAD), late("ok")],
                 [running("r", 4, time_limit=20 * H)], offers=(SPOT, OD),
                 settings={"sla": {}})
    budget = replace(burst, budgets={"t": 1e6})
    green = replace(idle, carbon_forecast={"Z": ((NOW, 100.0),)})
    return {
        "order": (BUNDLES["spillway"], lambda mp, add: mp.setattr(
            policies.order.orderings, "order_size",
            breaking(policies.order.orderings.order_size, 0)), idle),
        "admit": (PolicySet(admit="t-admit", name="t"), lambda mp, add: add(
            "admit", "t-admit", _bad_admit), idle),
        "place": (PolicySet(place="t-place", name="t"), lambda mp, add: add(
            "place", "t-place", BadPlace()), idle),
        "reserve": (PolicySet(reserve="t-reserve", name="t"), lambda mp, add: add(
            "reserve", "t-reserve", BadReserve()), busy),
        "estimate": (PolicySet(estimate="t-estimate", name="t"), lambda mp, add: add(
            "estimate", "t-estimate", _bad_estimate), idle),
        "evict": (PolicySet(name="t"), lambda mp, add: mp.setattr(
            policies.evict.priority, "choose", breaking(policies.evict.priority.choose, 0)),
            preempt),
        "burst": (PolicySet(burst="sla", name="t"), lambda mp, add: mp.setattr(
            policies.burst.sla, "_decide", breaking(policies.burst.sla._decide)), burst),
        "budget": (PolicySet(burst="sla", name="t"), lambda mp, add: mp.setattr(
            policies.burst.budget, "_within_max_price",
            breaking(policies.burst.budget._within_max_price)),
            budget),
        "defer": (PolicySet(defer="carbon", name="t"), lambda mp, add: mp.setattr(
            policies.carbon.defer, "decide", breaking(policies.carbon.defer.decide)), green),
    }


ROWS = _rows()


def without(s: Snapshot, job_id: str) -> Snapshot:
    return replace(s, pending=tuple(j for j in s.pending if j.id != job_id))


def _same_but_bad(got: Plan, clean: Plan) -> None:
    """``got`` is ``clean`` (the plan of the snapshot without ``bad``) plus ``bad``'s reason."""
    assert replace(got, pending={k: v for k, v in got.pending.items() if k != BAD},
                   set_aside={}) == clean


@pytest.mark.parametrize("role", sorted(ROWS))
def test_a_policy_failing_on_one_job_sets_it_aside(
        role: str, monkeypatch: pytest.MonkeyPatch,
        registered: Callable[[str, str, Any], None]) -> None:
    policies_, patch, s = ROWS[role]
    patch(monkeypatch, registered)
    plan = run_cycle(s, policies_, s.now)
    clean = run_cycle(without(s, BAD), policies_, s.now)  # (the patch fails on bad alone)

    aside = plan.set_aside[BAD]
    assert list(plan.set_aside) == [BAD]
    name = policies_.names(role)[0]
    assert (aside.role, aside.policy) == (role, name)
    assert aside.error.startswith("Boom: no rule for bad at unit/test_cycle_containment.py:")
    assert plan.pending[BAD] is aside.reason and aside.reason.code == "PolicyError"
    assert f"the {role} policy {name!r} failed on this job (Boom: no rule for bad" \
        in aside.reason.message
    assert BAD not in {s.job_id for s in plan.starts} and BAD not in plan.order
    # the others: exactly as if it were not there (and they do get decided)
    _same_but_bad(plan, clean)
    assert clean.starts or clean.preemptions or clean.launches


def test_the_cpu_only_job_starts_beside_the_others_on_every_bundle() -> None:
    s = snap([_host()], _queue(), [])
    for name, bundle in BUNDLES.items():
        plan = run_cycle(s, bundle, s.now)
        assert {st.job_id for st in plan.starts} == {"one", BAD, "cpu"}, name
        cpu = next(st for st in plan.starts if st.job_id == "cpu")
        assert cpu.allocations == (Allocation("a", ()),)


def test_many_jobs_failing_the_order_are_all_set_aside_in_one_cycle(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The issue's cluster: CPU-only jobs broke spillway's order (a division by their GPUs);
    with such a bug, each of them is set aside and the GPU jobs are still scheduled."""
    def size(job: Job) -> int:
        return 1 // job.res.total_gpus  # ZeroDivisionError for a CPU-only job
    monkeypatch.setattr(policies.order.orderings, "order_size", size)
    queue = [pending(f"c{i}", 0, priority="normal", cpus=1.0) for i in range(5)] + \
        [pending("g", 1, priority="normal")]
    plan = run_cycle(snap([_host()], queue, []), BUNDLES["spillway"], NOW)
    assert set(plan.set_aside) == {f"c{i}" for i in range(5)}
    assert {(a.role, a.policy) for a in plan.set_aside.values()} == {("order", "spillway")}
    assert all(a.error.startswith("ZeroDivisionError") for a in plan.set_aside.values())
    assert [st.job_id for st in plan.starts] == ["g"]


def test_a_lone_job_the_order_fails_on_is_set_aside(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(policies.order.orderings, "order_size",
                        breaking(policies.order.orderings.order_size, 0))
    plan = run_cycle(snap([_host()], [pending(BAD, 1)], []), BUNDLES["spillway"], NOW)
    assert list(plan.set_aside) == [BAD] and not plan.starts


# -- what is not one job's --------------------------------------------------------------------

@pytest.mark.parametrize(("policies_", "settings", "error"), [
    (PolicySet(burst="sla", name="t"), {"sla": {"preempt_or_burst": "often"}}, ValueError),
    (BUNDLES["spillway"], {"spillway": {"fairshare_weight": "x"}}, TypeError),
])
def test_a_broken_setting_read_before_the_jobs_fails_the_cycle(
        policies_: PolicySet, settings: dict[str, Any], error: type[Exception]) -> None:
    s = replace(ROWS["burst"][2], settings=settings)
    with pytest.raises(error):
        run_cycle(s, policies_, s.now)


def test_a_broken_setting_read_for_each_job_fails_the_cycle() -> None:
    """It fails on every job: that is not the jobs' fault (CycleFailed, caused by it)."""
    s = replace(snap([_host()], _queue(), []),
                settings={"spillway": {"class_weight": {"normal": "x"}}})
    with pytest.raises(CycleFailed, match="3 of 3 pending jobs") as e:
        run_cycle(s, BUNDLES["spillway"], s.now)
    assert isinstance(e.value.__cause__, TypeError)


def test_a_failure_on_a_different_job_in_every_pass_fails_the_cycle(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A policy that fails on whichever job it is asked about first (here: the head of the
    queue, each pass anew) is not failing on one job: after MAX_PASSES passes, the cycle
    fails."""
    def first_fails(cycle: Any, job: Job, end: float) -> Any:
        if job.id == cycle.queue[0].id:
            raise Boom("the head, whoever it is")
        return cycle.index.find(job.res, job.spec.sites)
    placer = BestFit()
    monkeypatch.setattr(placer, "place", first_fails)
    monkeypatch.setitem(registry._REGISTRY["place"], "t-first", placer)
    queue = [pending(f"j{i}", 1, priority="normal", submitted=5000.0 + i) for i in range(6)]
    with pytest.raises(CycleFailed, match=f"each pass|{MAX_PASSES}") as e:
        run_cycle(snap([_host()], queue, []), PolicySet(place="t-first", name="t"), NOW)
    assert isinstance(e.value.__cause__, Boom)


def test_a_base_exception_is_never_contained(monkeypatch: pytest.MonkeyPatch) -> None:
    def interrupted(job: Job) -> int:
        raise KeyboardInterrupt
    monkeypatch.setattr(policies.order.orderings, "order_size", interrupted)
    with pytest.raises(KeyboardInterrupt):
        run_cycle(snap([_host()], _queue(), []), BUNDLES["spillway"], NOW)
