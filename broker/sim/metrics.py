"""Metrics of one simulation run, and a text table comparing several runs.

Definitions (all times in seconds since the trace's start):

- A record is *infeasible* when it could never fit the cluster; it is counted in ``jobs`` and
  ``infeasible`` and left out of every other statistic.
- *wait* = ``first_start_s - submit_s``, over feasible records that started.
- Percentiles use linear interpolation between closest ranks (numpy's default, "linear"): the
  p-th percentile of sorted ``x[0..n-1]`` is ``x[k] + (x[k+1] - x[k]) * f`` where
  ``k + f = p / 100 * (n - 1)``.
- *bounded slowdown* of a finished record = ``max(1, (wait + duration_s) / max(duration_s, 10))``.
- Samples form a step function: each sample's values hold until the next sample's ``t``; the
  horizon runs from the first sample's ``t`` to the last one's.
- *SLA attainment*: of the feasible records that started, plus those that never started but had
  already waited longer than their SLA at the horizon's end (misses), the share whose wait was
  at most ``sla_s``. Feasible records that never started and are still within their SLA at the
  end are not counted either way.
- A statistic over an empty set (the mean wait of no job, the Jain index of no team) is
  ``None`` (JSON ``null``); ``utilization`` and ``busy_utilization`` are ``0.0`` then.

Rounding: ratios to 4 decimals, seconds to 1 decimal, GPU-hours to 2 decimals.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from itertools import pairwise
from typing import Any

from broker.sim.types import JobRecord, Sample, SimResult

SLOWDOWN_BOUND_S = 10.0  # the tau of bounded slowdown: jobs shorter than this count as this long


# ------------------------------------------------------------------------------------ helpers


def percentile(sorted_values: Sequence[float], p: float) -> float | None:
    """The ``p``-th percentile (0..100) of already sorted values, by linear interpolation
    (numpy's default method); ``None`` for no values."""
    n = len(sorted_values)
    if n == 0:
        return None
    if n == 1:
        return float(sorted_values[0])
    rank = min(max(p, 0.0), 100.0) / 100.0 * (n - 1)
    lo = math.floor(rank)
    hi = min(lo + 1, n - 1)
    frac = rank - lo
    return float(sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * frac)


def jain_index(values: Sequence[float]) -> float | None:
    """Jain's fairness index ``(sum x)^2 / (n * sum x^2)``: 1 when all are equal, 1/n when one
    value holds everything; ``None`` for no values, 1.0 when all are zero."""
    n = len(values)
    if n == 0:
        return None
    total = math.fsum(values)
    squares = math.fsum(v * v for v in values)
    if squares == 0.0:
        return 1.0
    return total * total / (n * squares)


def bounded_slowdown(record: JobRecord) -> float | None:
    """``max(1, (wait + duration) / max(duration, 10 s))`` of a record that started, else None."""
    if record.first_start_s is None:
        return None
    wait = record.first_start_s - record.submit_s
    return max(1.0, (wait + record.duration_s) / max(record.duration_s, SLOWDOWN_BOUND_S))


def step_integrals(samples: Sequence[Sample]) -> tuple[float, float, float, float]:
    """``(busy GPU-seconds, horizon, busy GPU-seconds while queued, seconds while queued)`` of
    the step function the samples describe (each holds until the next sample's ``t``)."""
    busy = busy_queued = queued_len = 0.0
    for cur, nxt in pairwise(samples):
        dt = nxt.t - cur.t
        if dt <= 0.0:
            continue
        area = cur.busy_gpus * dt
        busy += area
        if cur.queued_jobs > 0:
            busy_queued += area
            queued_len += dt
    horizon = samples[-1].t - samples[0].t if samples else 0.0
    return busy, horizon, busy_queued, queued_len


def _mean(values: Sequence[float]) -> float | None:
    return math.fsum(values) / len(values) if values else None


def _r(value: float | None, digits: int) -> float | None:
    if value is None or math.isnan(value):
        return None
    if math.isinf(value):
        return None
    return round(value, digits)


def _ratio(value: float | None) -> float | None:
    return _r(value, 4)


def _secs(value: float | None) -> float | None:
    return _r(value, 1)


def _jsonable(value: Any) -> Any:
    """A JSON-serialisable copy of ``value`` (mappings, sequences, numbers, strings, None)."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_jsonable(v) for v in value]
    return str(value)


class _Group:
    """Accumulates the statistics of one set of records (all, one team, one class)."""

    __slots__ = ("bslds", "gpu_s", "jobs", "preemptions", "sla_hit", "sla_n", "waits")

    def __init__(self) -> None:
        self.jobs = 0
        self.waits: list[float] = []
        self.bslds: list[float] = []
        self.sla_hit = 0
        self.sla_n = 0
        self.gpu_s = 0.0
        self.preemptions = 0

    def sla(self) -> float | None:
        return self.sla_hit / self.sla_n if self.sla_n else None


# ------------------------------------------------------------------------------------ metrics


def compute_metrics(
    result: SimResult,
    wall_s: float,
    invariant_violations: int,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The JSON-serialisable metrics of one run (see the module's docstring for definitions)."""
    samples = result.samples
    busy_s, horizon, busy_queued_s, queued_len = step_integrals(samples)
    cap = result.capacity_gpus
    utilization = busy_s / (cap * horizon) if cap > 0 and horizon > 0 else 0.0
    busy_util = busy_queued_s / (cap * queued_len) if cap > 0 and queued_len > 0 else 0.0

    if samples:
        horizon_end = samples[-1].t
    else:  # no samples: the latest instant any record mentions
        horizon_end = max(
            (max(r.submit_s, r.end_s or 0.0, r.first_start_s or 0.0) for r in result.records),
            default=0.0,
        )

    overall = _Group()
    teams: dict[str, _Group] = defaultdict(_Group)
    classes: dict[str, _Group] = defaultdict(_Group)
    jcts: list[float] = []
    finished = infeasible = unfinished = started = preemptions = moves = yields = failed = 0
    lost_gpu_s = 0.0

    for rec in result.records:
        team, cls = teams[rec.team], classes[rec.priority]
        groups = (overall, team, cls)
        for g in groups:
            g.jobs += 1
        preemptions += rec.preemptions
        moves += rec.moves
        yields += rec.yields
        lost_gpu_s += rec.lost_gpu_s
        team.preemptions += rec.preemptions
        if rec.infeasible:
            infeasible += 1
            continue
        if rec.end_s is None:
            unfinished += 1
            failed += rec.failed
        if rec.first_start_s is None:
            # Never started: a miss if it had already waited past its SLA by the horizon's end.
            if horizon_end - rec.submit_s > rec.sla_s:
                for g in groups:
                    g.sla_n += 1
            continue
        started += 1
        wait = rec.first_start_s - rec.submit_s
        hit = wait <= rec.sla_s
        for g in groups:
            g.waits.append(wait)
            g.sla_n += 1
            g.sla_hit += hit
        if rec.end_s is not None:
            finished += 1
            jcts.append(rec.end_s - rec.submit_s)
            bsld = max(1.0, (wait + rec.duration_s) / max(rec.duration_s, SLOWDOWN_BOUND_S))
            overall.bslds.append(bsld)
            team.bslds.append(bsld)
            team.gpu_s += rec.gpus * rec.duration_s

    for g in (overall, *teams.values(), *classes.values()):
        g.waits.sort()

    team_bslds = [m for g in teams.values() if (m := _mean(g.bslds)) is not None]
    waits = overall.waits

    metrics: dict[str, Any] = {
        "policy": result.policy,
        "capacity_gpus": cap,
        "jobs": overall.jobs,
        "finished": finished,
        "started": started,
        "infeasible": infeasible,
        "unfinished": unfinished,
        "jobs_failed": failed,
        "utilization": _ratio(utilization),
        "busy_utilization": _ratio(busy_util),
        "wait_mean_s": _secs(_mean(waits)),
        "wait_p50_s": _secs(percentile(waits, 50)),
        "wait_p95_s": _secs(percentile(waits, 95)),
        "wait_p99_s": _secs(percentile(waits, 99)),
        "wait_max_s": _secs(waits[-1] if waits else None),
        "jct_mean_s": _secs(_mean(jcts)),
        "bounded_slowdown_mean": _ratio(_mean(overall.bslds)),
        "sla_attainment": _ratio(overall.sla()),
        "sla_attainment_by_class": {c: _ratio(g.sla()) for c, g in sorted(classes.items())},
        "jain_fairness": _ratio(jain_index(team_bslds)),
        "preemptions": preemptions,
        "defrag_moves": moves,  # of the preemptions: moves making whole nodes for a wide job
        "relief_evictions": yields,  # of the preemptions: room made for a starved short job
        "gpu_hours_lost_to_preemption": _r(lost_gpu_s / 3600.0, 2),
        "per_team": {
            t: {
                "jobs": g.jobs,
                "wait_mean_s": _secs(_mean(g.waits)),
                "wait_p95_s": _secs(percentile(g.waits, 95)),
                "bounded_slowdown_mean": _ratio(_mean(g.bslds)),
                "gpu_hours": _r(g.gpu_s / 3600.0, 2),
                "preemptions": g.preemptions,
            }
            for t, g in sorted(teams.items())
        },
        "per_class": {
            c: {
                "jobs": g.jobs,
                "wait_mean_s": _secs(_mean(g.waits)),
                "wait_p95_s": _secs(percentile(g.waits, 95)),
                "sla_attainment": _ratio(g.sla()),
            }
            for c, g in sorted(classes.items())
        },
        "queue_max_jobs": max((s.queued_jobs for s in samples), default=0),
        "queue_max_gpus": max((s.queued_gpus for s in samples), default=0),
        "horizon_s": _secs(horizon),
        "wall_s": _r(wall_s, 3),
        "invariant_violations": invariant_violations,
    }
    if extra:
        metrics.update(_jsonable(extra))
    metrics["meta"] = _jsonable(result.meta)
    return metrics


# ------------------------------------------------------------------------------------ table


def _fmt_dur(seconds: Any) -> str:
    """Seconds as ``45s``, ``12.3m`` or ``4.56h``; ``-`` for a missing value."""
    if not isinstance(seconds, (int, float)) or isinstance(seconds, bool):
        return "-"
    if seconds < 60:
        return f"{seconds:.0f}s"
    if seconds < 3600:
        return f"{seconds / 60:.1f}m"
    return f"{seconds / 3600:.2f}h"


def _fmt_num(value: Any, spec: str) -> str:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return "-"
    return format(value, spec)


def _fmt_pct(value: Any) -> str:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return "-"
    return f"{100 * value:.1f}%"


_COLUMNS: tuple[tuple[str, str, str], ...] = (
    # (header, key, kind)
    ("util", "utilization", "pct"),
    ("busy util", "busy_utilization", "pct"),
    ("wait mean", "wait_mean_s", "dur"),
    ("p50", "wait_p50_s", "dur"),
    ("p95", "wait_p95_s", "dur"),
    ("p99", "wait_p99_s", "dur"),
    ("bsld", "bounded_slowdown_mean", ".2f"),
    ("Jain", "jain_fairness", ".3f"),
    ("SLA", "sla_attainment", "pct"),
    ("preempt", "preemptions", "d"),
    ("CO2 kg", "carbon_kg", ".0f"),  # broker/sim/energy.py
    ("$/GPU-h", "cost_per_gpu_hour", ".3f"),
    ("viol", "invariant_violations", "d"),
    ("wall", "wall_s", "wall"),
)


def _cell(value: Any, kind: str) -> str:
    if kind == "pct":
        return _fmt_pct(value)
    if kind == "dur":
        return _fmt_dur(value)
    if kind == "wall":
        return _fmt_num(value, ".1f") + ("s" if isinstance(value, (int, float)) else "")
    if kind == "d":
        return _fmt_num(value, "d") if isinstance(value, int) else _fmt_num(value, ".0f")
    return _fmt_num(value, kind)


def summary_table(results: Sequence[Mapping[str, Any]], width: int | None = None) -> str:
    """A fixed-width text table with one row per policy's metrics dict (from
    :func:`compute_metrics`); waits in seconds, minutes or hours as their size suits. Wider
    than ``width`` (a terminal's; None: any width), the columns are split into blocks one
    under the other, each starting with the policy, so that no row wraps."""
    header = ["policy", *(h for h, _, _ in _COLUMNS)]
    rows: list[list[str]] = [
        [str(m.get("policy", "?")), *(_cell(m.get(key), kind) for _, key, kind in _COLUMNS)]
        for m in results
    ]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    blocks: list[list[int]] = [[0]]
    for i in range(1, len(header)):
        if width is not None and len(blocks[-1]) > 1 and (
                sum(widths[j] + 2 for j in blocks[-1]) + widths[i] > width):
            blocks.append([0])
        blocks[-1].append(i)

    def line(cells: Sequence[str], cols: Sequence[int]) -> str:
        parts = [cells[i].ljust(widths[i]) if i == 0 else cells[i].rjust(widths[i])
                 for i in cols]
        return "  ".join(parts).rstrip()

    out: list[str] = []
    for cols in blocks:
        if out:
            out.append("")
        out += [line(header, cols), line(["-" * w for w in widths], cols)]
        out.extend(line(r, cols) for r in rows)
    return "\n".join(out)
