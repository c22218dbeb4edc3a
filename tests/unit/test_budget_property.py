"""Property: over random workloads and caps, a hard cap is never exceeded.

Each example gives teams hard caps (some already partly spent) and a queue of jobs whose SLA
breaks, on a cluster whose one node is full; a few cycles follow. Each cycle runs the real
chain: the snapshot's budgets from the book, the burst phase and the budget step
(``run_cycle``), the atomic reservation (``reserve_plan``), then the machines it launches run:
each job for a random part of its time limit (the agent stops it at the limit), the machine
idles a random part of the idle timeout and is given back, and the ledger charges every hour of
it, split by GPU-seconds. After every cycle, no team's spend, nor its spend plus what is still
reserved, is above its cap.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from hypothesis import example, given, settings
from hypothesis import strategies as st

from broker.cycle.scheduler import run_cycle
from broker.model import Instance, InstanceState, StateChange
from broker.money.ledger import Use, charge_instance, payers_of, reserve_plan
from broker.store.budgets import Budget, with_budgets
from broker.store.budgets_memory import MemoryBudgets
from broker.store.instances import request_ids
from tests.builders import node
from tests.unit.test_burst import OD, SLA, SPOT, late, offer
from tests.unit.test_preemption import NOW, running, snap

H = 3600.0
SPOT4 = offer("spot", gpus=4, price=3.2)
TEAMS = ("a", "b", "c")

job_st = st.tuples(st.sampled_from(TEAMS), st.integers(1, 2), st.floats(0.1, 8.0),
                   st.floats(0.0, 1.0))
# short jobs that rent machines, then long ones that may start on them and keep them up
short_st = st.tuples(st.sampled_from(TEAMS), st.integers(1, 2), st.floats(0.1, 1.0),
                     st.floats(0.0, 1.0))
long_st = st.tuples(st.sampled_from(TEAMS), st.integers(1, 2), st.floats(2.0, 8.0),
                    st.floats(0.5, 1.0))


@settings(max_examples=60, deadline=None)
@given(caps=st.dictionaries(st.sampled_from(TEAMS), st.tuples(st.floats(0.0, 40.0),
                                                              st.floats(0.0, 1.0)),
                            min_size=1),
       jobs=st.lists(job_st, min_size=1, max_size=10), cycles=st.integers(1, 3),
       idle=st.floats(0.0, 1.0))
# found by hypothesis: c's 2-GPU job and a's two 1-GPU jobs packed on one 4-GPU machine; a's
# end at once, c's runs its 3 hours and pays 3/4 of the machine (its GPUs and half the idle
# ones), where the reservation had counted 2/4
@example(caps={"c": (10.0, 0.5)}, jobs=[("c", 2, 3.0, 1.0), ("a", 1, 1.0, 0.0),
                                        ("a", 1, 1.0, 0.0)], cycles=1, idle=0.0)
def test_hard_caps_are_never_exceeded(caps: dict[str, tuple[float, float]],
                                      jobs: list[tuple[str, int, float, float]], cycles: int,
                                      idle: float) -> None:
    book = MemoryBudgets()
    for team, (cap, _) in caps.items():
        book.set(Budget(team, cap, "total"), "test", NOW)
    for team, (cap, spent_part) in caps.items():  # some of it spent before
        book.reserve([(f"before-{team}", team, cap * spent_part)], NOW)
    queue = [late(f"j{i}", gpus=g, team=t, time_limit=limit * H)
             for i, (t, g, limit, _) in enumerate(jobs)]
    ran = {f"j{i}": frac for i, (*_, frac) in enumerate(jobs)}
    by_id = {j.id: j for j in queue}
    for k in range(cycles):
        now = NOW + k * H
        s = snap([node("a", 4)], queue, [running("r", 4, time_limit=99 * H)], now=now,
                 offers=(SPOT, OD, SPOT4), settings={"sla": {"margin_s": 0}})
        plan = reserve_plan(book, run_cycle(with_budgets(s, book), SLA, now), now)
        offers = {o.id: o for o in (SPOT, OD, SPOT4)}
        for launch in plan.launches:
            o = offers[launch.offer_id]
            boot = float(o.extra["boot_s"])
            mine = [by_id[i] for i in launch.for_jobs]
            runs = [ran[j.id] * float(j.spec.time_limit or 0) for j in mine]
            end = now + boot + max(runs) + idle * 300.0
            for rid in request_ids(launch.request_id, launch.count):
                inst = Instance(rid, o.id, requested_at=now, price_per_hour=o.price_per_hour,
                                node_id=f"n-{rid}", for_jobs=launch.for_jobs,
                                history=(StateChange(InstanceState.REQUESTED, now, ""),))
                inst = inst.moved(InstanceState.BOOTING, now, "").moved(
                    InstanceState.TERMINATED, end, "")
                uses = [Use(j.team, j.res.gpus, now + boot, now + boot + r)
                        for j, r in zip(mine, runs)]
                charge_instance(book, inst, o.price_per_hour, o.gpu_count, uses,
                                payers_of(inst, by_id), end + H)
        gone = {i for x in plan.launches for i in x.for_jobs}
        queue = [j for j in queue if j.id not in gone]
        reserved = book.reserved()
        for team, (cap, _) in caps.items():
            spent = book.spent(team).get("total", 0.0)
            assert spent <= cap + 1e-6, (team, spent, cap)
            assert spent + reserved.get(team, 0.0) <= cap + 1e-6


def _machines(plan: Any, now: float, by_id: dict[str, Any]) -> list[dict[str, Any]]:
    """The machines a plan's launches rent (booting at ``now``, ready after the boot)."""
    offers = {o.id: o for o in (SPOT, OD, SPOT4)}
    out = []
    for launch in plan.launches:
        o = offers[launch.offer_id]
        for rid in request_ids(launch.request_id, launch.count):
            out.append({"rid": rid, "offer": o, "for": launch.for_jobs,
                        "ready": now + float(o.extra["boot_s"]), "at": now,
                        "jobs": [by_id[i] for i in launch.for_jobs]})
    return out


@settings(max_examples=60, deadline=None)
@given(caps=st.dictionaries(st.sampled_from(TEAMS), st.floats(0.0, 30.0), min_size=1),
       first=st.lists(short_st, min_size=1, max_size=6),
       later=st.lists(long_st, min_size=1, max_size=6), idle=st.floats(0.0, 1.0))
def test_hard_caps_hold_when_other_teams_start_on_rented_machines(
        caps: dict[str, float], first: list[tuple[str, int, float, float]],
        later: list[tuple[str, int, float, float]], idle: float) -> None:
    """Machines launched in one cycle are up in the next, where other teams' jobs may start on
    their free GPUs (their shares and the launchers' idle GPUs reserved); each machine then runs
    until its last job ends plus part of the idle tail. No hard cap is passed."""
    book = MemoryBudgets()
    for team, cap in caps.items():
        book.set(Budget(team, cap, "total"), "test", NOW)
    jobs = [late(f"j{i}", gpus=g, team=t, time_limit=limit * H)
            for i, (t, g, limit, _) in enumerate([*first, *later])]
    by_id = {j.id: j for j in jobs}
    ran = {f"j{i}": 0.05 + 0.95 * f for i, (*_, f) in enumerate([*first, *later])}
    full = [running("r", 4, time_limit=99 * H)]
    cfg = {"sla": {"margin_s": 0}}
    s1 = snap([node("a", 4)], jobs[:len(first)], full, offers=(SPOT, OD, SPOT4), settings=cfg)
    machines = _machines(reserve_plan(book, run_cycle(with_budgets(s1, book), SLA, NOW), NOW),
                         NOW, by_id)
    t2 = NOW + 61.0  # the machines are up; the jobs they were launched for run
    nodes, active, records, started = [node("a", 4)], list(full), [], set()
    for m in machines:
        o, nid = m["offer"], f"n-{m['rid']}"
        nodes.append(node(nid, o.gpu_count, o.gpu_model, site=o.site.id))
        first_gpu = 0
        for j in m["jobs"]:
            active.append(replace(running(j.id, j.res.gpus, nid, first=first_gpu, team=j.team,
                                          started=m["ready"]), spec=j.spec))
            first_gpu += j.res.gpus
            started.add(j.id)
        rec = Instance(m["rid"], o.id, requested_at=NOW, price_per_hour=o.price_per_hour,
                       node_id=nid, for_jobs=m["for"],
                       history=(StateChange(InstanceState.REQUESTED, NOW, ""),))
        records.append(rec.moved(InstanceState.BOOTING, NOW, "").moved(InstanceState.READY,
                                                                      m["ready"], ""))
    queue = [j for j in jobs if j.id not in started]
    s2 = snap(nodes, queue, active, now=t2, offers=(SPOT, OD, SPOT4), settings=cfg,
              instances=tuple(records))
    rec_by_node = {r.node_id: r for r in records}
    plan2 = reserve_plan(book, run_cycle(with_budgets(s2, book), SLA, t2), t2,
                         machine_of=lambda n: (rec_by_node[n].request_id, payers_of(
                             rec_by_node[n], by_id)) if n in rec_by_node else None)
    uses: dict[str, list[Use]] = {r.node_id: [] for r in records}
    for m in machines:
        for j in m["jobs"]:
            uses[f"n-{m['rid']}"].append(Use(j.team, j.res.gpus, m["ready"], m["ready"] + ran[
                j.id] * float(j.spec.time_limit or 0)))
    for st_ in plan2.starts:
        j = by_id[st_.job_id]
        for a in st_.allocations:
            if a.node_id in uses:
                uses[a.node_id].append(Use(j.team, len(a.gpu_ids), t2, t2 + ran[j.id] * float(
                    j.spec.time_limit or 0)))
    later_machines = _machines(plan2, t2, by_id)
    for m in later_machines:
        nid = f"n-{m['rid']}"
        rec = Instance(m["rid"], m["offer"].id, requested_at=t2, node_id=nid,
                       price_per_hour=m["offer"].price_per_hour, for_jobs=m["for"],
                       history=(StateChange(InstanceState.REQUESTED, t2, ""),))
        records.append(rec.moved(InstanceState.BOOTING, t2, ""))
        uses[nid] = [Use(j.team, j.res.gpus, m["ready"], m["ready"] + ran[j.id] * float(
            j.spec.time_limit or 0)) for j in m["jobs"]]
    for rec in records:
        end = max(u.end or 0.0 for u in uses[rec.node_id]) + idle * 300.0
        gone = rec.moved(InstanceState.TERMINATED, end, "")
        o = next(o for o in (SPOT, OD, SPOT4) if o.id == rec.offer_id)
        charge_instance(book, gone, o.price_per_hour, o.gpu_count, uses[rec.node_id],
                        payers_of(gone, by_id), end + H)
    for team, cap in caps.items():
        assert book.spent(team).get("total", 0.0) <= cap + 1e-6, (team, cap)
