"""The ledger: what rented machines cost, charged to the teams that used them, and the
reservations that keep bursts within hard caps.

**Reserve** (:func:`reserve_plan`, called by the actuator before a Plan is applied, and by the
simulator): each launch's ``budget`` shares (policies/burst/budget.py) are reserved in the budget
book in one atomic check-and-reserve per launch, split evenly over its machines (keyed by
each machine's request id), and so is each start on a machine rented for other jobs (its GPUs'
share of the machine). A launch or start the book refuses is dropped from the Plan and its jobs
stay pending with ``BudgetExhausted`` and by how much. Tokens (the launch's request id,
``start:<job>:<attempt>``) make a Plan applied twice reserve once.

**Charge** (:func:`accrue`, each lifecycle pass): a machine is billed from when the provider
accepted it (its first BOOTING) to when it ended (TERMINATED or FAILED), in UTC-hour intervals.
An interval is booked once it is over (or the machine ended), in order, under the key
(request id, hour): the book refuses a key booked before, so a pass repeated, or one that
restarts after a crash, charges nothing twice and loses nothing (the records are durable).
Its cost (the price recorded at launch x its length) is split by GPU-seconds: each team pays
for the GPU-seconds its jobs held on the machine's node; idle GPU-seconds (booting, between
jobs, the idle tail) go to the teams of the jobs the machine was launched for (by their GPUs;
``_operator`` for a launch by hand). Charges use up the machine's reservation first.

**Settle**: once a machine has ended and every interval is booked, what is left of its
reservation is released. A reservation whose machine was never recorded (the actuator died
between the two) is released after ``ORPHAN_AFTER_S``.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timezone

from broker.cycle.plan import Plan
from broker.model import Instance, InstanceState, Job, Reason
from broker.store.base import BaseStore
from broker.store.budgets import BudgetBook, Part
from broker.store.instances import request_ids
from policies.burst.budget import LAUNCHERS
from policies.reasons import budget_exhausted

log = logging.getLogger(__name__)
INTERVAL_S = 3600.0  # one charge per machine per UTC hour
ORPHAN_AFTER_S = 600.0
OPERATOR = "_operator"  # who pays for a machine launched by hand


@dataclass(frozen=True)
class Use:
    """GPUs a job's team held on one node from ``start`` to ``end`` (None: still)."""

    team: str
    gpus: int
    start: float
    end: float | None


# -- reserve ---------------------------------------------------------------------------------


Machine = tuple[str, Mapping[str, float]]  # a rented machine: its key, its launchers' weights


def reserve_plan(book: BudgetBook, plan: Plan, now: float,
                 teams: Callable[[str], str] | None = None,
                 machine_of: Callable[[str], Machine | None] | None = None) -> Plan:
    """``plan`` less the starts and launches the book refuses (see the module docstring).
    ``teams``: job id -> team, for the reasons of the other jobs of a refused launch;
    ``machine_of``: node id -> the rented machine it is (its request id, and team -> GPUs of
    the jobs it was launched for), for starts on machines rented for others."""
    if not any(x.budget for x in plan.launches) and not any(x.budget for x in plan.starts):
        return plan
    starts, refused = [], {}
    for st in plan.starts:
        parts = _start_parts(st.budget, machine_of)
        no = book.reserve(parts, now, f"start:{st.job_id}:{st.attempt}") if parts else None
        if no is None:
            starts.append(st)
            continue
        why = budget_exhausted(no.team, no.cap, no.spent + no.reserved, no.need)
        own = st.budget[0][1] if st.budget else no.team
        refused[st.job_id] = why if own == no.team else Reason(
            why.code, f"the rented machine it would start on pays its idle GPUs from team "
                      f"{no.team}'s budget, which it would keep up; {why.message}")
    launches = []
    for launch in plan.launches:
        if not launch.budget:
            launches.append(launch)
            continue
        keys = request_ids(launch.request_id, launch.count)
        parts = [(k, team, usd / len(keys)) for k in keys for team, usd in launch.budget]
        no = book.reserve(parts, now, launch.request_id)
        if no is None:
            launches.append(launch)
            continue
        log.warning("launch %s refused: team %s's hard cap $%.2f would be passed by $%.2f",
                    launch.request_id, no.team, no.cap, no.over_by)
        for job_id in launch.for_jobs:
            team = teams(job_id) if teams else no.team
            refused[job_id] = budget_exhausted(no.team, no.cap, no.spent + no.reserved,
                                               no.need) if team == no.team else \
                Reason("Bursting", f"the machine it was to share with team {no.team} was "
                                   "refused by that team's cap; planned again next cycle")
    if not refused:
        return plan
    return replace(plan, starts=tuple(starts), launches=tuple(launches),
                   pending={**plan.pending, **refused})


def _start_parts(budget: Sequence[tuple[str, str, float]],
                 machine_of: Callable[[str], Machine | None] | None
                 ) -> list[tuple[str, str, float]]:
    """``Start.budget`` as reservation parts: each node's machine key, the launchers' part
    split by their weights (none: a machine launched by hand, whose idle time no budget pays)."""
    parts: list[tuple[str, str, float]] = []
    for node, team, usd in budget:
        machine = machine_of(node) if machine_of else None
        if machine is None:
            continue
        key, payers = machine
        if team != LAUNCHERS:
            parts.append((key, team, usd))
            continue
        whole = sum(payers.values())
        parts += [(key, t, usd * w / whole) for t, w in sorted(payers.items()) if whole]
    return parts


# -- charge ----------------------------------------------------------------------------------


def billing_start(inst: Instance) -> float | None:
    """When the provider accepted the machine (its first move out of REQUESTED to a state
    that runs); None if it never ran."""
    for h in inst.history:
        if h.state in (InstanceState.BOOTING, InstanceState.READY):
            return h.time
    return None


def uses_by_node(jobs: Iterable[Job]) -> dict[str, list[Use]]:
    """Node id -> every attempt part that held GPUs there."""
    out: dict[str, list[Use]] = {}
    for job in jobs:
        for att in job.attempts:
            for a in att.allocations:
                out.setdefault(a.node_id, []).append(
                    Use(job.team, len(a.gpu_ids) or job.res.gpus, att.started_at, att.ended_at))
    return out


def day_of(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%d")


def split(price_per_hour: float, gpus: int, a: float, b: float, uses: Sequence[Use],
          payers: Mapping[str, float], site: str) -> list[Part]:
    """The cost of ``[a, b)`` on one machine, by team (see the module docstring). ``payers``:
    team -> weight of the idle time it pays."""
    length = max(0.0, b - a)
    if length <= 0:
        return []
    cost = price_per_hour * length / 3600.0
    whole = max(1, gpus) * length
    used: dict[str, float] = {}
    for u in uses:
        end = b if u.end is None else min(u.end, b)
        held = max(0.0, end - max(u.start, a)) * u.gpus
        if held > 0:
            used[u.team] = used.get(u.team, 0.0) + held
    total_used = sum(used.values())
    if total_used > whole:  # (rounding, or a record that overlaps: never charge above cost)
        used = {t: v * whole / total_used for t, v in used.items()}
        total_used = whole
    idle = whole - total_used
    weights = payers or {OPERATOR: 1.0}
    wsum = sum(weights.values()) or 1.0
    day = day_of(a)
    teams = sorted(set(used) | set(weights))
    parts = []
    for t in teams:
        held_s = used.get(t, 0.0)
        idle_s = idle * weights.get(t, 0.0) / wsum
        if held_s or idle_s:
            parts.append(Part(t, cost * (held_s + idle_s) / whole, held_s, idle_s, site, day))
    return parts


def charge_instance(book: BudgetBook, inst: Instance, price: float, gpus: int,
                    uses: Sequence[Use], payers: Mapping[str, float], now: float,
                    interval_s: float = INTERVAL_S) -> set[str]:
    """Book every closed interval of ``inst`` not booked yet, settle it once it ended and
    all are booked. Returns the teams charged."""
    key = inst.request_id
    mark = book.charged_upto(key)
    if mark == -1:
        return set()
    start = billing_start(inst)
    end = inst.ended_at if inst.ended else None
    charged: set[str] = set()
    if start is not None:
        stop = end if end is not None else now
        first = int(start // interval_s)
        last = math.ceil(stop / interval_s) - 1
        site = inst.offer_id.partition("/")[0]
        for k in range(max(first, (mark if mark is not None else first - 1) + 1), last + 1):
            a, b = max(start, k * interval_s), min(stop, (k + 1) * interval_s)
            if end is None and (k + 1) * interval_s > now:
                break  # still open
            parts = split(price, gpus, a, b, uses, payers, site)
            if book.charge(key, k, parts, a):
                charged.update(p.team for p in parts)
    if end is not None:
        book.settle(key)
    return charged


def payers_of(inst: Instance, jobs: Mapping[str, Job]) -> dict[str, float]:
    """Team -> GPUs of the jobs ``inst`` was launched for (who pays its idle time)."""
    out: dict[str, float] = {}
    for job_id in inst.for_jobs:
        j = jobs.get(job_id)
        if j is not None:
            out[j.team] = out.get(j.team, 0.0) + max(1, j.res.total_gpus)
    return out


@dataclass
class Accrued:
    charged_teams: set[str]
    settled: int
    orphans: int
    alerts: list[tuple[str, float]]


def due(book: BudgetBook, inst: Instance, now: float, interval_s: float = INTERVAL_S) -> bool:
    """Whether ``inst`` has an interval to book, or is to be settled, at ``now``."""
    if inst.ended:
        return True
    start = billing_start(inst)
    if start is None:
        return False
    mark = book.charged_upto(inst.request_id)
    nxt = int(start // interval_s) if mark is None else mark + 1
    return (nxt + 1) * interval_s <= now


def accrue(book: BudgetBook, records: Sequence[Instance], jobs: Sequence[Job],
           gpus_of: Callable[[Instance], int], now: float,
           interval_s: float = INTERVAL_S) -> Accrued:
    """One ledger pass over the instance records (see the module docstring): ``jobs`` must
    hold every job that ran on the machines with an interval due."""
    done = book.settled()
    todo = [r for r in records if r.request_id not in done]
    by_id = {j.id: j for j in jobs}
    uses = uses_by_node(jobs) if todo else {}
    charged: set[str] = set()
    settled = 0
    for inst in todo:
        node_uses = uses.get(inst.node_id, []) if inst.node_id else []
        charged |= charge_instance(book, inst, inst.price_per_hour, gpus_of(inst), node_uses,
                                   payers_of(inst, by_id), now, interval_s)
        settled += inst.ended
    orphans = release_orphans(book, records, now)
    alerts = [(t, a) for t in sorted(charged) for a in book.fire_alerts(t, now)]
    for team, pct in alerts:
        log.warning("budget alert: team %s has spent %g%% of its budget", team, pct)
    return Accrued(charged, settled, orphans, alerts)


def release_orphans(book: BudgetBook, records: Sequence[Instance], now: float) -> int:
    """Release the reservations of machines never recorded, ``ORPHAN_AFTER_S`` on."""
    known = {r.request_id for r in records}
    orphans = {r.key for r in book.reservations()
               if r.key not in known and now - r.at > ORPHAN_AFTER_S}
    for key in orphans:
        book.settle(key)
    return len(orphans)


def accrue_store(store: BaseStore, book: BudgetBook, now: float) -> Accrued:
    """:func:`accrue` over a store's records and jobs (the provisioner's lifecycle pass). The
    jobs are read only when an interval is due (about once an hour, and when a machine
    ends)."""
    records = store.instances()
    done = book.settled()
    if not any(r.request_id not in done and due(book, r, now) for r in records):
        return Accrued(set(), 0, release_orphans(book, records, now), [])
    offers = {o.id: o.gpu_count for o in store.offers(now, include_blocked=True)}
    nodes = {n.id: len(n.gpus) for n in store.nodes()}

    def gpus_of(inst: Instance) -> int:
        return offers.get(inst.offer_id) or nodes.get(inst.node_id) or 1

    return accrue(book, records, store.list_jobs(), gpus_of, now)
