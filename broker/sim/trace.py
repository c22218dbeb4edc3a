"""Workload traces for the simulator: the packaged Philly trace, or a CSV file of your own.

``load_trace(source)`` returns a :class:`~broker.sim.types.Trace`: jobs sorted by
``(submit_s, id)``, ``submit_s`` in seconds since the first kept job, and ``notes`` saying what
was derived. The same (source, options, seed) always gives the same trace.

Sources and formats
-------------------

``"philly"``
    The Microsoft Philly trace, Sep-Oct 2017 (52,849 jobs; ``broker/sim/data/philly.csv.gz``,
    CC BY 4.0, see ``data/NOTICE.md``). Columns ``timestamp,duration,num_gpus,gpu_time,cluster``.
    Timestamps are the trace's naive local clock and are read as UTC. ``team`` is
    ``"vc-" + cluster`` (the Philly virtual cluster); ``id`` is ``philly-NNNNNN``, the row's index
    in the file (0 = first data row), stable across loads and windows. Rows with
    ``duration <= 0`` are dropped and counted in the notes. The trace has no time limits, classes
    or GPU types: limits and classes are derived (below) and every job runs on any GPU.

a path to a CSV file (``.csv`` or ``.csv.gz``), the generic format
    A header row is required; columns may come in any order; unknown columns are refused.

    ============== ======== ==================================================================
    column         required meaning
    ============== ======== ==================================================================
    submit_time    yes      ISO 8601 (UTC when it has no zone) or seconds (epoch or relative)
    duration_s     yes      runtime in seconds, > 0 (on ``gpu_type`` when given)
    num_gpus       yes      total GPUs, a whole number >= 1 (split into a gang when larger than
                            a node, below)
    id             no       unique; default ``job-NNNNNN`` (the data row's index, from 0)
    team           no       default ``default``
    gpu_type       no       the GPU family or model the duration was measured on (``A100``,
                            ``A100-80GB``); it also pins the job to that type
    priority       no       a class name of the simulated cluster; default: drawn (below)
    time_limit_s   no       seconds, > 0; may be below ``duration_s`` (the simulator then kills
                            the job at its limit); default: derived (below)
    preemptible    no       true/false/yes/no/1/0; empty: as the job's class says
    name           no       free text
    ============== ======== ==================================================================

    Empty optional cells mean "not given". Bad input raises :class:`TraceError` (a
    :class:`~broker.errors.ConfigError`) naming the file, the line, the column, what is wrong and
    what is allowed.

Windows and load scaling
------------------------

``start``/``end`` (epoch seconds, or the file's own seconds when it uses relative times) keep
the jobs with ``start <= submit < end``. ``load_scale`` X then keeps every job and divides every
gap between consecutive arrivals by X: ``submit_s = (submit - first_submit) / X``. X > 1 packs
the same work into less time (more offered load); X < 1 spreads it out.
:func:`busiest_window`, :func:`offered_load_gpus` and :func:`scale_for` help choose both.

Gangs
-----

A job asking for G GPUs with G > ``max_gpus_per_node`` becomes a gang of n nodes x G/n GPUs,
where n starts at ``ceil(G / max_gpus_per_node)`` and grows until it divides G (12 -> 2 x 6,
16 -> 2 x 8, 24 -> 3 x 8 with 8-GPU nodes). Smaller jobs run on one node.

Derived time limits
-------------------

Where the trace gives no limit, the user's limit is modelled after two published models of
user runtime estimates on parallel machines:

- the *f-model* of Mu'alem & Feitelson ("Utilization, Predictability, Workloads, and User
  Runtime Estimates in Scheduling the IBM SP2 with Backfilling", IEEE TPDS 12(6), 2001): an
  estimate is the actual runtime times a factor drawn uniformly at random, here from
  ``[1, F]`` with ``F = 5`` (:data:`OVERESTIMATE_F`); and
- the observation of Tsafrir, Etsion & Feitelson ("Modeling User Runtime Estimates", JSSPP
  2005, LNCS 3834) that estimates are *modal*: a handful of round values (1 h, 4 h, a day, ...)
  make up most of them.

So the limit is the smallest of the usual values in :data:`USUAL_LIMITS_S` (1 h, 2 h, 4 h, 8 h,
12 h, 24 h, 48 h, 72 h, 7 days) that is at least ``duration x f``; beyond 7 days it is rounded up
to whole weeks. A derived limit is therefore always >= the duration.

Derived priority classes
------------------------

Where the trace gives no priority, each job's class is drawn with the shares of
:data:`CLASS_SHARES`: critical 2%, high 10%, normal 58%, low 30%. Only names that exist in the
simulated cluster's ``classes`` are drawn from (their shares renormalised); when none of the four
exists, every job gets the class in the middle of the ranking (``classes`` sorted by rank,
highest first, index ``len // 2``).

Both draws are deterministic per ``(seed, job id)``: they come from a BLAKE2b hash of
``"{seed}:{id}"``, not from a shared random generator, so every policy, every window and every
load scale sees the same limit and class for the same job.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Mapping
from datetime import datetime, timezone

from broker.config.core import DEFAULT_CLASSES, PriorityClass
from broker.sim.trace_derive import (
    CLASS_SHARES,
    DAY,
    OVERESTIMATE_F,
    USUAL_LIMITS_S,
    class_picker,
    derived_class,
    derived_time_limit,
    gang_shape,
    round_limit,
    uniforms,
)
from broker.sim.trace_read import FORMATS, Row, TraceError, read_rows
from broker.sim.types import Trace, TraceJob

__all__ = ["CLASS_SHARES", "OVERESTIMATE_F", "USUAL_LIMITS_S", "TraceError", "busiest_window",
           "class_counts", "derived_class", "derived_time_limit", "gang_shape", "load_trace",
           "offered_load_gpus", "round_limit", "scale_for", "team_names"]


def _iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def load_trace(
    source: str,
    fmt: str | None = None,
    *,
    start: float | None = None,
    end: float | None = None,
    load_scale: float = 1.0,
    seed: int = 0,
    classes: tuple[PriorityClass, ...] = DEFAULT_CLASSES,
    max_gpus_per_node: int = 8,
) -> Trace:
    """Read a trace (``"philly"`` or a CSV path), window it, scale it and derive what it lacks.

    See the module docstring for the formats and the derivations. Raises :class:`TraceError`.
    """
    if fmt is not None and fmt not in FORMATS:
        raise TraceError(f"trace format {fmt!r} is unknown; allowed: {', '.join(FORMATS)}")
    if not (isinstance(load_scale, (int, float)) and math.isfinite(load_scale)
            and load_scale > 0):
        raise TraceError(f"load scale {load_scale!r} must be a number > 0 (1 = as recorded)")
    if max_gpus_per_node < 1:
        raise TraceError(f"max GPUs per node {max_gpus_per_node} must be at least 1")
    if not classes:
        raise TraceError("the simulated cluster has no priority classes")
    if start is not None and end is not None and end <= start:
        raise TraceError(f"the window end {end} must be after its start {start}")
    rows, dropped, where, kind = read_rows(source, fmt, [c.name for c in classes])
    notes: list[str] = [f"{where} ({kind} format): {len(rows) + dropped} jobs read"]
    if dropped:
        notes.append(f"{dropped} jobs dropped (duration <= 0)")
    total_read = len(rows)
    if start is not None or end is not None:
        lo = -math.inf if start is None else start
        hi = math.inf if end is None else end
        rows = [r for r in rows if lo <= r.submit < hi]
        span = f"[{_iso(lo) if start is not None else '-'}, {_iso(hi) if end is not None else '-'})"
        notes.append(f"window {span}: {len(rows)} of {total_read} jobs kept")
        if not rows:
            raise TraceError(f"{where}: no job was submitted in the window {span}")
    if not rows:
        raise TraceError(f"{where}: the trace has no jobs")
    rows.sort(key=lambda r: (r.submit, r.id))
    return _build(rows, where, notes, load_scale, seed, classes, max_gpus_per_node)


def _build(rows: list[Row], where: str, notes: list[str], load_scale: float, seed: int,
           classes: tuple[PriorityClass, ...], max_per_node: int) -> Trace:
    pick, class_text = class_picker(classes)
    origin = rows[0].submit
    jobs: list[TraceJob] = []
    limits = drawn = gangs = 0
    for r in rows:
        u_limit, u_class = uniforms(seed, r.id)
        limit = r.time_limit_s
        if limit is None:
            limit = round_limit(r.duration_s * (1.0 + u_limit * (OVERESTIMATE_F - 1.0)))
            limits += 1
        priority = r.priority
        if priority is None:
            priority = pick(u_class)
            drawn += 1
        nodes, per_node = gang_shape(r.total_gpus, max_per_node)
        if nodes > 1:
            gangs += 1
        jobs.append(TraceJob(
            id=r.id, submit_s=(r.submit - origin) / load_scale, duration_s=r.duration_s,
            gpus=per_node, nodes=nodes, team=r.team, priority=priority, time_limit_s=limit,
            gpu_type=r.gpu_type, preemptible=r.preemptible, name=r.name,
        ))
    if limits:
        notes.append(f"time limits derived for {limits} jobs (f-model F={OVERESTIMATE_F:g}, "
                     f"usual values, seed {seed})")
    if drawn:
        notes.append(f"classes drawn for {drawn} jobs ({class_text}; seed {seed})")
    if gangs:
        notes.append(f"{gangs} jobs split into gangs (at most {max_per_node} GPUs per node)")
    if load_scale != 1:
        notes.append(f"load scale {load_scale:g} (arrival gaps divided by {load_scale:g})")
    return Trace(name=where, origin=origin, jobs=tuple(jobs), notes=tuple(notes))


# ---------------------------------------------------------------------------------------------
# Offered load


def _work(jobs: Iterable[TraceJob]) -> float:
    return sum(j.total_gpus * j.duration_s for j in jobs)


def offered_load_gpus(trace: Trace) -> float:
    """Average GPUs demanded over the whole trace: GPU-seconds / (last submit - first submit).

    0.0 for an empty trace; ``inf`` when every job arrives at the same instant.
    """
    if not trace.jobs:
        return 0.0
    work = _work(trace.jobs)
    span = trace.jobs[-1].submit_s - trace.jobs[0].submit_s
    if span <= 0:
        return math.inf if work > 0 else 0.0
    return work / span


def busiest_window(trace: Trace, days: float = 14, step_s: float = 86400
                   ) -> tuple[float, float, float]:
    """The ``[start, end)`` window of ``days`` with the largest offered load, and that load.

    Windows start at the first job's ``submit_s`` and step by ``step_s`` while they end by the
    last submission (a trace shorter than the window has one window, from its start). Times
    are the trace's ``submit_s`` seconds (add ``trace.origin`` for epoch seconds when the trace
    was loaded with ``load_scale`` 1). The load is the average GPUs demanded:
    ``sum(total_gpus x duration_s)`` of the jobs submitted in the window / its length. Ties go to
    the earliest window.
    """
    length = days * DAY
    if length <= 0 or step_s <= 0:
        raise ValueError("busiest_window: days and step_s must be > 0")
    if not trace.jobs:
        return 0.0, length, 0.0
    submits = [j.submit_s for j in trace.jobs]
    prefix = [0.0]
    for j in trace.jobs:
        prefix.append(prefix[-1] + j.total_gpus * j.duration_s)
    first, last = submits[0], submits[-1]
    best = (first, first + length, -1.0)
    k = 0
    while True:
        lo = first + k * step_s
        if k and lo + length > last:
            break
        i = bisect.bisect_left(submits, lo)
        e = bisect.bisect_left(submits, lo + length)
        load = (prefix[e] - prefix[i]) / length
        if load > best[2]:
            best = (lo, lo + length, load)
        k += 1
    return best


def scale_for(trace: Trace, capacity_gpus: float, target_util: float, *,
              offered_gpus: float | None = None) -> float:
    """The ``load_scale`` that brings the offered load to ``target_util x capacity_gpus``.

    ``X = target_util x capacity_gpus / offered``, where ``offered`` is
    :func:`offered_load_gpus` of ``trace`` unless given (e.g. the load :func:`busiest_window`
    returns). X is relative to ``trace`` as loaded: load it with ``load_scale=1`` and pass X.
    """
    offered = offered_load_gpus(trace) if offered_gpus is None else offered_gpus
    if not offered > 0 or math.isinf(offered):
        raise ValueError(f"scale_for: the offered load {offered} must be finite and > 0")
    if capacity_gpus <= 0 or target_util <= 0:
        raise ValueError("scale_for: capacity_gpus and target_util must be > 0")
    return target_util * capacity_gpus / offered


def team_names(trace: Trace) -> list[str]:
    """The trace's teams, sorted."""
    return sorted({j.team for j in trace.jobs})


def class_counts(trace: Trace) -> Mapping[str, int]:
    """Jobs per class."""
    out: dict[str, int] = {}
    for j in trace.jobs:
        out[j.priority] = out.get(j.priority, 0) + 1
    return out
