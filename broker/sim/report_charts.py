"""The charts of a simulation report (broker/sim/report.py) and the data behind them: time
series bucketed to at most :data:`MAX_POINTS` points, wait-time CDFs, the per-team service.
matplotlib (Agg) is imported where a figure is made, so the HTML page can use the helpers
without it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timezone
from functools import partial
from itertools import pairwise
from pathlib import Path
from typing import TYPE_CHECKING, Any

from broker.sim.metrics import compute_metrics
from broker.sim.types import Sample, SimResult

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

MAX_POINTS = 2000  # per line of a time series or CDF
MAX_TEAMS = 20
MIN_WAIT_S = 1.0  # waits shorter than this are drawn at this value on the log axis

CHARTS: tuple[tuple[str, str], ...] = (
    ("utilization.png", "GPU utilisation over time"),
    ("queue.png", "Queue length over time"),
    ("wait_cdf.png", "Wait-time CDF"),
    ("per_team.png", "Per-team service"),
)


def bucket_series(
    samples: Sequence[Sample], value: Callable[[Sample], float], max_points: int = MAX_POINTS
) -> tuple[list[float], list[float]]:
    """``(times, values)`` of the step function the samples describe (each holds until the
    next sample's ``t``), at most ``max_points`` of them: when there are more samples, the
    time-weighted mean over each of ``max_points`` equal buckets, placed at the bucket's start.
    """
    if not samples:
        return [], []
    if len(samples) <= max_points:
        return [s.t for s in samples], [float(value(s)) for s in samples]
    t0, t1 = samples[0].t, samples[-1].t
    span = t1 - t0
    if span <= 0:
        return [t0], [float(value(samples[-1]))]
    n = max_points
    width = span / n
    sums = [0.0] * n
    for cur, nxt in pairwise(samples):
        a, b = cur.t, nxt.t
        if b <= a:
            continue
        v = float(value(cur))
        i = min(int((a - t0) / width), n - 1)
        while a < b and i < n:
            edge = t1 if i == n - 1 else t0 + (i + 1) * width
            end = min(b, edge)
            if end > a:
                sums[i] += v * (end - a)
            a = end
            i += 1
    return [t0 + i * width for i in range(n)], [s / width for s in sums]


def _waits(result: SimResult) -> list[float]:
    return sorted(
        r.first_start_s - r.submit_s
        for r in result.records
        if not r.infeasible and r.first_start_s is not None
    )


def _cdf(
    sorted_waits: Sequence[float], max_points: int = MAX_POINTS
) -> tuple[list[float], list[float]]:
    """``(wait hours, cumulative share)`` of sorted waits, at most ``max_points`` points."""
    n = len(sorted_waits)
    if n == 0:
        return [], []
    step = max(1, math.ceil(n / max_points))
    idx = list(range(0, n, step))
    if idx[-1] != n - 1:
        idx.append(n - 1)
    xs = [max(sorted_waits[i], MIN_WAIT_S) / 3600.0 for i in idx]
    ys = [(i + 1) / n for i in idx]
    return xs, ys


def metrics_of(result: SimResult) -> Mapping[str, Any]:
    return result.metrics or compute_metrics(result, wall_s=0.0, invariant_violations=0)


def _time_unit(results: Sequence[SimResult]) -> tuple[float, str]:
    horizon = max((r.samples[-1].t - r.samples[0].t for r in results if r.samples), default=0.0)
    return (86400.0, "days") if horizon > 3 * 86400 else (3600.0, "hours")


def origin_of(results: Sequence[SimResult]) -> float | None:
    """Epoch seconds of the trace's start (``meta["trace_origin"]``), if the runs know it."""
    origins = {r.meta.get("trace_origin") for r in results}
    value: Any = origins.pop() if len(origins) == 1 else None
    return float(value) if is_num(value) else None


def is_num(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def utc_date(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, tz=timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def _new_figure(width: float = 10.0, height: float = 4.5) -> Figure:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _save(fig: Figure, path: Path) -> None:
    fig.savefig(str(path), format="png")


def _time_axis(ax: Axes, results: Sequence[SimResult]) -> Callable[[float], Any]:
    """Label ``ax``'s x axis and return how to place a sample's ``t`` on it: the trace's own
    dates when the runs know its start, else the time since it in hours or days."""
    origin = origin_of(results)
    if origin is None:
        scale, unit = _time_unit(results)
        ax.set_xlabel(f"time since trace start ({unit})")
        return lambda t: t / scale
    import matplotlib.dates as mdates

    locator = mdates.AutoDateLocator(minticks=4, maxticks=10)
    ax.xaxis.set_major_locator(locator)
    ax.xaxis.set_major_formatter(mdates.DateFormatter("%b %d\n%Y" if _spans_years(results)
                                                      else "%b %d"))
    scales = {r.meta.get("load_scale") for r in results}
    load_scale: Any = scales.pop() if len(scales) == 1 else None
    spread = (f"; arrival gaps divided by the load scale {load_scale:g}"
              if is_num(load_scale) and load_scale != 1 else "")
    ax.set_xlabel(f"trace date (UTC{spread})")
    last = max((r.meta.get("last_submit_s", 0.0) for r in results), default=0.0)
    if is_num(last) and last > 0:
        ax.axvline(_as_date(origin + float(last)), color="0.5", linestyle=":", linewidth=1.0,
                   label="last arrival")
    return lambda t: _as_date(origin + t)


def _spans_years(results: Sequence[SimResult]) -> bool:
    origin = origin_of(results) or 0.0
    end = max((r.samples[-1].t for r in results if r.samples), default=0.0)
    years = {datetime.fromtimestamp(origin + t, tz=timezone.utc).year for t in (0.0, end)}
    return len(years) > 1


def _as_date(epoch: float) -> float:
    """Epoch seconds as matplotlib's date number (UTC)."""
    import matplotlib.dates as mdates

    return float(mdates.date2num(datetime.fromtimestamp(epoch, tz=timezone.utc)))


def _series_chart(
    results: Sequence[SimResult],
    path: Path,
    value: Callable[[SimResult, Sample], float],
    title: str,
    ylabel: str,
    log: bool = False,
) -> None:
    fig = _new_figure()
    ax = fig.add_subplot()
    place = _time_axis(ax, results)
    for res in results:
        xs, ys = bucket_series(res.samples, partial(value, res))
        ax.plot([place(x) for x in xs], ys, label=res.policy, linewidth=1.0,
                drawstyle="steps-post")
    if log:
        # 0 stays drawable: linear below 1, logarithmic above
        ax.set_yscale("symlog", linthresh=1.0, linscale=0.5)
        ax.set_ylim(bottom=0)
        ylabel += " (log scale above 1)"
    ax.set_title(title)
    ax.set_ylabel(ylabel)
    ax.grid(True, which="both" if log else "major", alpha=0.3)
    if results:
        ax.legend(loc="best", fontsize="small")
    _save(fig, path)


def _utilization_chart(results: Sequence[SimResult], path: Path) -> None:
    def util(res: SimResult, s: Sample) -> float:
        return s.busy_gpus / res.capacity_gpus if res.capacity_gpus > 0 else 0.0

    _series_chart(results, path, util, "GPU utilisation (busy / capacity)", "utilisation")


def _queue_chart(results: Sequence[SimResult], path: Path) -> None:
    _series_chart(results, path, lambda _res, s: float(s.queued_jobs),
                  "Queue length (feasible jobs waiting)", "queued jobs", log=True)


def _wait_cdf_chart(results: Sequence[SimResult], path: Path) -> None:
    fig = _new_figure()
    ax = fig.add_subplot()
    drawn = False
    for res in results:
        xs, ys = _cdf(_waits(res))
        if xs:
            ax.step(xs, ys, where="post", label=res.policy, linewidth=1.2)
            drawn = True
    if drawn:
        ax.set_xscale("log")
        lo, hi = ax.get_xlim()
        ticks = [(h, label) for h, label in _WAIT_TICKS if lo <= h <= hi]
        ax.set_xticks([h for h, _ in ticks], [label for _, label in ticks])
        ax.legend(loc="lower right", fontsize="small")
    ax.set_ylim(0.0, 1.02)
    ax.set_title("Wait-time CDF (feasible jobs that started)")
    ax.set_xlabel(f"wait (log scale; waits under {MIN_WAIT_S:g} s drawn at {MIN_WAIT_S:g} s)")
    ax.set_ylabel("share of jobs")
    ax.grid(True, which="both", alpha=0.3)
    _save(fig, path)


_WAIT_TICKS = ((1 / 3600, "1 s"), (10 / 3600, "10 s"), (1 / 60, "1 min"), (10 / 60, "10 min"),
               (1.0, "1 h"), (10.0, "10 h"), (100.0, "100 h"), (1000.0, "1000 h"))


def _top_teams(results: Sequence[SimResult]) -> list[str]:
    counts: dict[str, int] = {}
    for res in results:
        for team, stats in metrics_of(res).get("per_team", {}).items():
            counts[team] = max(counts.get(team, 0), int(stats.get("jobs", 0)))
    return sorted(counts, key=lambda t: (-counts[t], t))[:MAX_TEAMS]


def _per_team_chart(results: Sequence[SimResult], path: Path) -> None:
    teams = _top_teams(results)
    fig = _new_figure(min(20.0, max(10.0, 0.25 * len(teams) * max(1, len(results)) + 4)), 7.5)
    ax_wait, ax_bsld = fig.subplots(2, 1, sharex=True)
    n = max(1, len(results))
    width = 0.8 / n
    positions = list(range(len(teams)))
    for k, res in enumerate(results):
        per_team = metrics_of(res).get("per_team", {})
        waits = [_num(per_team.get(t, {}).get("wait_mean_s")) / 3600.0 for t in teams]
        bslds = [_num(per_team.get(t, {}).get("bounded_slowdown_mean")) for t in teams]
        xs = [p - 0.4 + width * (k + 0.5) for p in positions]
        ax_wait.bar(xs, waits, width=width, label=res.policy)
        ax_bsld.bar(xs, bslds, width=width, label=res.policy)
    _label_team_axes(ax_wait, ax_bsld, teams, bool(results))
    _save(fig, path)


def _label_team_axes(ax_wait: Axes, ax_bsld: Axes, teams: list[str], legend: bool) -> None:
    ax_wait.set_title(f"Per-team service (top {len(teams)} teams by job count)")
    # both span orders of magnitude between policies: log scales (0 stays drawable)
    ax_wait.set_yscale("symlog", linthresh=0.1, linscale=0.5)
    ax_wait.set_ylim(bottom=0)
    ax_wait.set_ylabel("mean wait (hours, log above 0.1)")
    ax_bsld.set_yscale("log")
    ax_bsld.set_ylim(bottom=1)  # a bounded slowdown is at least 1
    ax_bsld.set_ylabel("mean bounded slowdown (log)")
    ax_bsld.set_xticks(list(range(len(teams))))
    ax_bsld.set_xticklabels(teams, rotation=45, ha="right", fontsize="small")
    for ax in (ax_wait, ax_bsld):
        ax.grid(True, axis="y", alpha=0.3)
    if legend:
        # beside the panel: over it, it hides the first team's bars
        ax_wait.legend(loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize="small")


def _num(value: Any) -> float:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0.0


def write_charts(results: Sequence[SimResult], out: Path) -> None:
    """Write the :data:`CHARTS` of ``results`` into the folder ``out``."""
    _utilization_chart(results, out / "utilization.png")
    _queue_chart(results, out / "queue.png")
    _wait_cdf_chart(results, out / "wait_cdf.png")
    _per_team_chart(results, out / "per_team.png")
