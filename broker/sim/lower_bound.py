"""An offline lower bound on the cloud cost (or the emissions) of serving a workload.

Perfect knowledge of every job (arrival, true runtime, GPUs, class, window), of the on-prem
GPUs, the cloud offers, their region quotas and when each spot zone has capacity, and a linear
program over time slots: the least a scheduler could spend (or emit) to serve the same work
with the same number of jobs per class inside their windows. docs/lower-bound.md writes the
program down; this module builds it and solves it with HiGHS (``scipy.optimize.linprog``).

Units: GPU-hours for work and capacity, dollars per GPU-hour, kg CO2e per GPU-hour.

Variables (all >= 0), for a *group* g (jobs of one type and class whose windows start and
end in the same slots, summed) and a slot s of its window:

- ``o[g,s]``, ``c[g,s]``: its GPU-hours on-prem and in the cloud, each at most ``cap[g,s]``
  (its GPUs x the part of the slot inside each job's window); ``o + c <= cap``;
- ``m[g]``: its work left outside the windows (jobs counted as missing their SLA);
- ``p[t,s,k]``: GPU-hours of jobs of type t on on-prem GPU model k in slot s;
- ``q[t,s,r]``: GPU-hours of jobs of type t on cloud option r (a site and GPU model) in slot s.

Rows: each group's work is done (``sum o + sum c + m = W``); per type and slot, the groups'
on-prem (cloud) hours are what the models (options) give it; per model and slot, at most its
GPUs x the slot; per region and slot, at most its quota x the slot; per spot zone and slot,
at most the quota x the seconds the zone has spot; per class, the missed work divided by
each group's largest job is at most the misses allowed for the class.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from broker.sim.lower_bound_problem import (
    OBJECTIVES,
    LbJob,
    LbOffer,
    LbPool,
    LbProblem,
    LbResult,
    allowed_model,
    check,
)

__all__ = ["OBJECTIVES", "LbJob", "LbOffer", "LbPool", "LbProblem", "LbResult", "solve"]


class _Lp:
    """Columns, bounds and the rows of an LP in triplet form."""

    def __init__(self) -> None:
        self.cost: list[float] = []
        self.ub: list[float] = []
        self.eq: tuple[list[int], list[int], list[float]] = ([], [], [])
        self.le: tuple[list[int], list[int], list[float]] = ([], [], [])
        self.b_eq: list[float] = []
        self.b_le: list[float] = []

    def col(self, cost: float, ub: float = math.inf) -> int:
        self.cost.append(cost)
        self.ub.append(ub)
        return len(self.cost) - 1

    def row(self, eq: bool, rhs: float) -> int:
        b = self.b_eq if eq else self.b_le
        b.append(rhs)
        return len(b) - 1

    def put(self, eq: bool, row: int, col: int, value: float) -> None:
        r, c, v = self.eq if eq else self.le
        r.append(row)
        c.append(col)
        v.append(value)


@dataclass
class _Group:
    key: tuple[Any, ...]
    first: int
    caps: list[float]
    work: float = 0.0
    largest: float = 0.0
    jobs: int = 0
    gpus: int = 0  # of its jobs together
    col_m: int | None = None
    job: LbJob | None = None  # a whole job's own group
    slot_o: dict[int, int] = field(default_factory=dict)  # slot -> its on-prem column
    slot_c: dict[int, int] = field(default_factory=dict)  # slot -> its cloud column


MAX_START_SLOTS = 400  # a whole job with more possible start slots is left relaxed


def _whole(j: LbJob, t0: float, slot_s: float) -> bool:
    """Whether ``j`` is modelled as whole: it is, runs at all, and its starts span few slots."""
    if not j.whole or j.runtime_s <= 0 or not math.isfinite(j.latest_start_s):
        return False
    return (j.latest_start_s - t0) // slot_s - (j.submit_s - t0) // slot_s < MAX_START_SLOTS


def _overlap(t: float, d: float, b: float, e: float) -> float:
    return max(0.0, min(t + d, e) - max(t, b))


def _span(t_lo: float, t_hi: float, d: float, b: float, e: float) -> tuple[float, float]:
    """The least and the most seconds of ``[b, e)`` that a run of ``d`` seconds covers when
    it starts anywhere in ``[t_lo, t_hi]`` (the overlap rises, stays, falls: it is least at
    an end of the interval and most where the interval meets its plateau)."""
    at = [t_lo, t_hi, min(max(b, t_lo), t_hi), min(max(e - d, t_lo), t_hi)]
    return (min(_overlap(t_lo, d, b, e), _overlap(t_hi, d, b, e)),
            max(_overlap(t, d, b, e) for t in at))


def _starts(j: LbJob, edges: Sequence[float], slot: float) -> list[tuple[float, float]]:
    """Per slot from ``j``'s arrival to its latest start: the starts in it, ``(lo, hi)``."""
    t0 = edges[0]
    first = min(int((j.submit_s - t0) // slot), len(edges) - 2)
    last = min(int((j.latest_start_s - t0) // slot), len(edges) - 2)
    return [(max(j.submit_s, edges[s]), min(edges[s + 1], j.latest_start_s))
            for s in range(first, last + 1)]


def _whole_rows(lp: _Lp, g: _Group, edges: Sequence[float], slot_s: float) -> None:
    """A whole job starts once, on-prem or in the cloud (fractions of a start per slot: the
    relaxation), and in every slot its GPU-hours on each side lie between the least and the
    most that its starts there give: no pause, no narrowing, no move between the sides."""
    j = g.job
    assert j is not None
    width = j.gpus * j.nodes / 3600.0
    starts = _starts(j, edges, slot_s)
    one = lp.row(True, 1.0)
    if g.col_m is not None:  # the work a miss leaves undone
        lp.put(True, one, g.col_m, 1.0 / g.work)
    for cols in (g.slot_o, g.slot_c):
        if not cols:
            continue
        xs = [lp.col(0.0, 1.0) for _ in starts]
        total = lp.col(0.0, 1.0)  # its share started on this side
        tie = lp.row(True, 0.0)
        lp.put(True, tie, total, 1.0)
        for x in xs:
            lp.put(True, one, x, 1.0)
            lp.put(True, tie, x, -1.0)
        for u, col in cols.items():
            spans = [_span(lo, hi, j.runtime_s, edges[u], edges[u + 1]) for lo, hi in starts]
            for sign, k in ((-1.0, 0), (1.0, 1)):  # col >= sum least x; col <= sum most x
                coef = [width * sp[k] for sp in spans]
                if sign < 0 and max(coef) <= 1e-12:
                    continue
                row = lp.row(False, 0.0)
                lp.put(False, row, col, sign)
                if max(coef) - min(coef) <= 1e-12:
                    lp.put(False, row, total, -sign * coef[0])
                else:
                    for x, c in zip(xs, coef):
                        if c > 1e-12:
                            lp.put(False, row, x, -sign * c)


def _edges(problem: LbProblem, slot_s: float) -> tuple[float, list[float]]:
    jobs = problem.jobs
    t0 = min((j.submit_s for j in jobs), default=0.0)
    t0 = min(t0, 0.0)
    ends = [j.end_s for j in jobs if math.isfinite(j.end_s)]
    ends += [j.submit_s + j.runtime_s for j in jobs]
    horizon = max([problem.horizon_s, t0 + slot_s, *ends])
    n = max(1, math.ceil((horizon - t0) / slot_s - 1e-9))
    edges = [t0 + i * slot_s for i in range(n)] + [horizon]
    return horizon, edges


def _groups(problem: LbProblem, edges: Sequence[float], horizon: float,
            slot_s: float) -> list[_Group]:
    t0, n = edges[0], len(edges) - 1
    out: dict[tuple[Any, ...], _Group] = {}
    for j in problem.jobs:
        a = j.submit_s
        e = min(j.end_s, horizon)
        first = min(int((a - t0) // slot_s), n - 1)
        last = max(first, min(math.ceil((e - t0) / slot_s) - 1, n - 1))
        whole = _whole(j, t0, slot_s)
        g = out.get(key := (j.type_key, j.cls, first, last, j.id if whole else None))
        if g is None:
            g = out[key] = _Group(key, first, [0.0] * (last - first + 1),
                                  job=j if whole else None)
        width = j.gpus * j.nodes / 3600.0
        for i in range(last - first + 1):
            lo, hi = max(a, edges[first + i]), min(e, edges[first + i + 1])
            if hi > lo:
                g.caps[i] += width * (hi - lo)
        g.work += j.gpu_hours
        g.largest = max(g.largest, j.gpu_hours)
        g.jobs += 1
        g.gpus += j.gpus * j.nodes
    return list(out.values())


def _options(problem: LbProblem, tkey: tuple[Any, ...], objective: str) -> list[LbOffer]:
    """The cloud options a type may use; for cost, the cheapest per capacity key."""
    gpus, types, cloud, spot = tkey
    if not cloud:
        return []
    fit = [o for o in problem.offers if o.gpu_count >= gpus and (spot or not o.is_spot)
           and allowed_model(o.gpu_model, types)]
    if objective == "carbon":
        return sorted(fit, key=lambda o: o.id)
    best: dict[tuple[str, str], LbOffer] = {}
    for o in sorted(fit, key=lambda o: (o.price_per_gpu_hour, o.id)):
        best.setdefault(o.capacity_key, o)
    return sorted(best.values(), key=lambda o: o.id)


def solve(problem: LbProblem, objective: str = "cost", misses: Mapping[str, int] | None = None,
          slot_s: float = 900.0, method: str = "highs-ipm") -> LbResult:
    """The least cloud cost (``cost``, dollars) or emissions (``carbon``, kg) of serving
    ``problem``'s jobs with at most ``misses[cls]`` jobs of each class outside their windows."""
    from scipy.optimize import linprog  # type: ignore[import-untyped]
    from scipy.sparse import coo_matrix  # type: ignore[import-untyped]

    misses = dict(misses or {})
    check(problem, objective, misses, slot_s)
    started = time.perf_counter()
    horizon, edges = _edges(problem, slot_s)
    n_slots = len(edges) - 1
    lens = [(edges[s + 1] - edges[s]) / 3600.0 for s in range(n_slots)]
    groups = _groups(problem, edges, horizon, slot_s)
    rate = problem.kg_per_gpu_hour
    carbon = objective == "carbon"
    lp = _Lp()
    # per group: its slots' columns, its work row, its cap rows (on-prem and cloud)
    used_on: dict[tuple[Any, ...], dict[int, list[int]]] = {}
    used_cl: dict[tuple[Any, ...], dict[int, list[tuple[int, int]]]] = {}  # (column, GPUs)
    may_cloud: dict[tuple[Any, ...], bool] = {}
    for g in groups:
        tkey, cls = g.key[0], g.key[1]
        cloud = may_cloud.get(tkey)
        if cloud is None:
            cloud = may_cloud[tkey] = bool(_options(problem, tkey, "cost"))
        work_row = lp.row(True, g.work)
        for i, cap in enumerate(g.caps):
            if cap <= 0:
                continue
            s = g.first + i
            o = lp.col(0.0, cap)
            lp.put(True, work_row, o, 1.0)
            used_on.setdefault(tkey, {}).setdefault(s, []).append(o)
            g.slot_o[s] = o
            if cloud:
                c = lp.col(0.0, cap)
                lp.put(True, work_row, c, 1.0)
                used_cl.setdefault(tkey, {}).setdefault(s, []).append((c, g.gpus))
                g.slot_c[s] = c
                cap_row = lp.row(False, cap)
                lp.put(False, cap_row, o, 1.0)
                lp.put(False, cap_row, c, 1.0)
        if misses.get(cls, 0) > 0:
            g.col_m = lp.col(0.0, g.work)
            lp.put(True, work_row, g.col_m, 1.0)
        if g.job is not None:
            _whole_rows(lp, g, edges, slot_s)
    # on-prem: per type and slot, the models it may use; per model and slot, its GPUs
    model_rows: dict[tuple[int, int], int] = {}
    min_rate: dict[tuple[Any, ...], float] = {}
    for tkey, by_slot in used_on.items():
        pools = [k for k, pool in enumerate(problem.pools)
                 if pool.gpus > 0 and allowed_model(pool.model, tkey[1])]
        for s, cols in by_slot.items():
            bal = lp.row(True, 0.0)
            for col in cols:
                lp.put(True, bal, col, 1.0)
            for k in pools:
                pool = problem.pools[k]
                kg = rate(pool.site, pool.model, edges[s], edges[s + 1]) \
                    if carbon and rate else 0.0
                min_rate[tkey] = min(min_rate.get(tkey, math.inf), kg)
                p = lp.col(kg)
                lp.put(True, bal, p, -1.0)
                row = model_rows.get((k, s))
                if row is None:
                    row = model_rows[(k, s)] = lp.row(False, pool.gpus * lens[s])
                lp.put(False, row, p, 1.0)
    # cloud: per type and slot, the options; per region and slot its quota; per spot zone
    # and slot, the quota while the zone has spot
    quota_rows: dict[tuple[str, int], int] = {}
    zone_rows: dict[tuple[str, int], int] = {}
    spot_up: dict[tuple[str, int], float] = {}
    for tkey, held_by_slot in used_cl.items():
        opts = _options(problem, tkey, objective)
        for s, held in held_by_slot.items():
            bal = lp.row(True, 0.0)
            for col, _ in held:
                lp.put(True, bal, col, 1.0)
            for offer in opts:
                quota = problem.quotas.get(offer.region, math.inf)
                zone_cap = spot_cap = math.inf
                if offer.spot_zone is not None and problem.spot_seconds is not None:
                    up = spot_up.get((offer.spot_zone, s))
                    if up is None:
                        up = spot_up[(offer.spot_zone, s)] = max(0.0, min(
                            edges[s + 1] - edges[s],
                            problem.spot_seconds(offer.spot_zone, edges[s], edges[s + 1])))
                    if up <= 0:
                        continue
                    zone_cap = quota * up / 3600.0
                    # the type's jobs, each on at most its GPUs while the zone has spot
                    spot_cap = sum(min(lp.ub[col], gpus * up / 3600.0) for col, gpus in held)
                coef = offer.price_per_gpu_hour if not carbon or rate is None \
                    else rate(offer.site, offer.gpu_model, edges[s], edges[s + 1])
                min_rate[tkey] = min(min_rate.get(tkey, math.inf), coef)
                q = lp.col(coef, spot_cap)
                lp.put(True, bal, q, -1.0)
                if math.isfinite(quota):
                    row = quota_rows.get((offer.region, s))
                    if row is None:
                        row = quota_rows[(offer.region, s)] = lp.row(False, quota * lens[s])
                    lp.put(False, row, q, 1.0)
                if math.isfinite(zone_cap) and offer.spot_zone is not None:
                    row = zone_rows.get((offer.spot_zone, s))
                    if row is None:
                        row = zone_rows[(offer.spot_zone, s)] = lp.row(False, zone_cap)
                    lp.put(False, row, q, 1.0)
    # misses: per class, the missed work over each group's largest job <= the misses allowed
    class_rows: dict[str, int] = {}
    for g in groups:
        if g.col_m is None:
            continue
        cls = g.key[1]
        row = class_rows.get(cls)
        if row is None:
            row = class_rows[cls] = lp.row(False, float(misses[cls]))
        lp.put(False, row, g.col_m, 1.0 / g.largest if g.largest > 0 else 0.0)
        if carbon:  # missed work still runs somewhere: at the least any slot emits
            lp.cost[g.col_m] = min_rate.get(g.key[0], 0.0) if math.isfinite(
                min_rate.get(g.key[0], math.inf)) else 0.0
    import numpy as np

    n = len(lp.cost)
    a_eq = coo_matrix((lp.eq[2], (lp.eq[0], lp.eq[1])), shape=(len(lp.b_eq), n)).tocsr()
    a_le = coo_matrix((lp.le[2], (lp.le[0], lp.le[1])), shape=(len(lp.b_le), n)).tocsr() \
        if lp.b_le else None
    bounds = np.column_stack([np.zeros(n), np.array(lp.ub, dtype=float)])
    built = time.perf_counter()
    res = linprog(np.array(lp.cost), A_ub=a_le, b_ub=np.array(lp.b_le) if lp.b_le else None,
                  A_eq=a_eq, b_eq=np.array(lp.b_eq), bounds=bounds, method=method)
    done = time.perf_counter()
    out = LbResult(objective, "optimal" if res.status == 0 else
                   "infeasible" if res.status == 2 else str(res.message),
                   float(res.fun) if res.status == 0 else None, slot_s, n_slots,
                   len(problem.jobs), len(groups), n, len(lp.b_eq) + len(lp.b_le),
                   len(lp.eq[0]) + len(lp.le[0]), built - started, done - built)
    if res.status == 0:
        x = res.x
        out.cloud_gpu_hours = float(sum(x[c] for g in groups for c in g.slot_c.values()))
        out.onprem_gpu_hours = float(sum(x[o] for g in groups for o in g.slot_o.values()))
        out.missed_gpu_hours = float(sum(x[g.col_m] for g in groups if g.col_m is not None))
    return out
