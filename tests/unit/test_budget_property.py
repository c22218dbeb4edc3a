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

from hypothesis import given, settings
from hypothesis import strategies as st

from broker.ledger import Use, charge_instance, payers_of, reserve_plan
from broker.model import Instance, InstanceState, StateChange
from broker.scheduler import run_cycle
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


@settings(max_examples=60, deadline=None)
@given(caps=st.dictionaries(st.sampled_from(TEAMS), st.tuples(st.floats(0.0, 40.0),
                                                              st.floats(0.0, 1.0)),
                            min_size=1),
       jobs=st.lists(job_st, min_size=1, max_size=10), cycles=st.integers(1, 3),
       idle=st.floats(0.0, 1.0))
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
