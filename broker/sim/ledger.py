"""Budgets in the simulator: the same budget step, reservation and ledger as production, on
the simulation's in-memory book.

A cluster file may give teams caps::

    budgets:                       # optional (docs/budgets.md)
      vision: {amount: 200, window: total, hard: true, alerts: [50, 80, 100]}
      nlp: {amount: 50, window: week, hard: false}

Each cycle's launches are reserved before the simulated clouds start them
(:func:`broker.money.ledger.reserve_plan`, what the actuator does); a machine that has ended is
charged with :func:`broker.money.ledger.charge_instance` (split by GPU-seconds, idle time to the
teams it was launched for) before the next snapshot is read, and its reservation settled. At
the end the machines still up are charged to the horizon, and ``budget_overruns`` counts the
(team, window) pairs whose hard cap the charges passed: it must be 0. The simulator's clock
starts at 0, so its windows count from 1970-01-01 UTC (a ``total`` cap is the usual choice).
The ``budgets`` section is read with the rest of the cluster file (broker/sim/cluster.py
:func:`~broker.sim.cluster.parse_budgets`).
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any, Protocol

from broker.cycle.plan import Plan
from broker.model import Instance, InstanceState
from broker.money.ledger import Machine, charge_instance, payers_of, reserve_plan, uses_by_node
from broker.store.budgets import EPS, Budget, BudgetBook, budget_book
from broker.store.instances import request_ids

if TYPE_CHECKING:
    from broker.sim.cloud import SimInstance
    from broker.sim.cloudrun import CloudRun
    from broker.store.memory import MemoryStore


class Host(Protocol):
    """What :class:`SimBudgets` sees of its simulation (broker/sim/engine.py
    :class:`~broker.sim.engine.Simulation`): its store and its clouds (read when used: a
    simulation may replace its clouds after the budgets are made)."""

    store: MemoryStore
    cloud: CloudRun | None



class SimBudgets:
    """One simulation's budgets (see the module docstring)."""

    def __init__(self, sim: Host, budgets: tuple[Budget, ...]) -> None:
        self.sim = sim
        self.book: BudgetBook = budget_book(sim.store)
        for b in budgets:
            self.book.set(b, "cluster file", 0.0)
        self.keys: dict[str, str] = {}  # simulated machine id -> its reservation key
        self.done: set[str] = set()

    def apply(self, plan: Plan, now: float) -> Plan:
        """The plan less the launches whose reservation the book refuses."""
        kept = reserve_plan(self.book, plan, now, lambda j: self.sim.store.get(j).team,
                            self._machine_of)
        for launch in kept.launches:
            for k, key in enumerate(request_ids(launch.request_id, launch.count)):
                self.keys[f"{launch.request_id}-{k}"] = key
        return kept

    def _machine_of(self, node_id: str) -> Machine | None:
        """The simulated machine that is node ``node_id``: its reservation key, and team ->
        GPUs of the jobs it was launched for."""
        inst = self.sim.cloud.by_node.get(node_id) if self.sim.cloud is not None else None
        if inst is None:
            return None
        jobs = {j: self.sim.store.get(j) for j in inst.for_jobs}
        pid = inst.record.provider_id
        return self.keys.get(pid, pid), payers_of(replace(inst.record, for_jobs=tuple(jobs)),
                                                  jobs)

    def settle(self, now: float, horizon: bool = False) -> None:
        """Charge the machines that have ended (``horizon``: all of them, up to ``now``)."""
        cloud = self.sim.cloud
        if cloud is None or not self.book.budgets():
            return
        todo = [i for pid, i in cloud.clouds.instances.items() if pid not in self.done
                and (i.record.ended or horizon)]
        if not todo:
            return
        jobs = self.sim.store.list_jobs()
        uses, by_id = uses_by_node(jobs), {j.id: j for j in jobs}
        for inst in todo:
            pid = inst.record.provider_id
            record = self._record(inst, now)
            charge_instance(self.book, record, inst.offer.price_per_hour,
                            inst.offer.gpu_count, uses.get(record.node_id, []),
                            payers_of(record, by_id), now)
            self.done.add(pid)
        for team in {j.team for j in jobs}:
            self.book.fire_alerts(team, now)

    def _record(self, inst: SimInstance, now: float) -> Instance:
        rec = inst.record
        if not rec.ended:  # (the end of the run closes its books)
            rec = rec.moved(InstanceState.TERMINATED, now, "the simulation ended") \
                if rec.state is not InstanceState.REQUESTED else rec
        return replace(rec, request_id=self.keys.get(rec.provider_id, rec.provider_id),
                       price_per_hour=inst.offer.price_per_hour,
                       for_jobs=tuple(sorted(inst.for_jobs)))

    def metrics(self, horizon: float) -> dict[str, Any]:
        self.settle(horizon, horizon=True)
        overruns = 0
        spend: dict[str, float] = {}
        for team, b in self.book.budgets().items():
            spent = self.book.spent(team)
            spend[team] = round(spent.get("total", 0.0), 2)
            for wid, usd in spent.items():
                kind = "total" if wid == "total" else "week" if "-W" in wid else "month"
                overruns += b.hard and kind == b.window and usd > b.amount + EPS
        out: dict[str, Any] = {"budget_overruns": overruns}
        if spend:
            out["budget_spend_usd"] = dict(sorted(spend.items()))
        return out
