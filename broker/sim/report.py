"""An HTML report of one or more simulation runs: PNG charts (matplotlib, Agg) and the metrics.

``write_report(results, out_dir)`` writes ``utilization.png``, ``queue.png``, ``wait_cdf.png``,
``per_team.png`` and ``index.html`` (relative image paths, inline CSS) into ``out_dir``.
matplotlib is an optional dependency (``pip install 'spillway[sim]'``) imported only here.
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timezone
from functools import partial
from itertools import pairwise
from pathlib import Path
from typing import TYPE_CHECKING, Any

from broker.errors import ConfigError
from broker.sim.metrics import compute_metrics, summary_table
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


# ------------------------------------------------------------------------------------ data


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


def _metrics(result: SimResult) -> Mapping[str, Any]:
    return result.metrics or compute_metrics(result, wall_s=0.0, invariant_violations=0)


def _time_unit(results: Sequence[SimResult]) -> tuple[float, str]:
    horizon = max((r.samples[-1].t - r.samples[0].t for r in results if r.samples), default=0.0)
    return (86400.0, "days") if horizon > 3 * 86400 else (3600.0, "hours")


def _origin(results: Sequence[SimResult]) -> float | None:
    """Epoch seconds of the trace's start (``meta["trace_origin"]``), if the runs know it."""
    origins = {r.meta.get("trace_origin") for r in results}
    value: Any = origins.pop() if len(origins) == 1 else None
    return float(value) if _is_num(value) else None


def _is_num(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _date(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, tz=timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


# ------------------------------------------------------------------------------------ charts


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
    origin = _origin(results)
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
              if _is_num(load_scale) and load_scale != 1 else "")
    ax.set_xlabel(f"trace date (UTC{spread})")
    last = max((r.meta.get("last_submit_s", 0.0) for r in results), default=0.0)
    if _is_num(last) and last > 0:
        ax.axvline(_as_date(origin + float(last)), color="0.5", linestyle=":", linewidth=1.0,
                   label="last arrival")
    return lambda t: _as_date(origin + t)


def _spans_years(results: Sequence[SimResult]) -> bool:
    origin = _origin(results) or 0.0
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
        for team, stats in _metrics(res).get("per_team", {}).items():
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
        per_team = _metrics(res).get("per_team", {})
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


# ------------------------------------------------------------------------------------ html

_CSS = """
body { font-family: system-ui, sans-serif; margin: 2em; color: #222; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 1.5em; }
table { border-collapse: collapse; font-size: 0.9em; margin: 0.5em 0; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: right; }
th:first-child, td:first-child { text-align: left; }
thead th { background: #f0f0f0; }
img { max-width: 100%; border: 1px solid #ddd; margin: 0.5em 0; }
pre { background: #f7f7f7; padding: 0.8em; overflow-x: auto; font-size: 0.85em; }
"""

_SCALAR_SKIP = {"policy", "meta", "per_team", "per_class", "sla_attainment_by_class"}


def _esc(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return html.escape(f"{value:g}" if abs(value) < 1e6 else f"{value:.1f}")
    return html.escape(str(value))


def _table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    head = "".join(f"<th>{_esc(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{_esc(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


_DATE_KEYS = {"window_start", "window_end", "trace_origin"}
_PCT_KEYS = {"utilization", "busy_utilization", "sla_attainment"}
_META_SKIP = {"notes"}  # shown as a list under the table


def _duration(seconds: float) -> str:
    """``45 s``, ``12.3 min``, ``17.87 h`` or ``1019.4 h (42.5 days)``."""
    if seconds < 60:
        return f"{seconds:.0f} s" if seconds >= 1 or seconds == 0 else f"{seconds:.2f} s"
    if seconds < 3600:
        return f"{seconds / 60:.1f} min"
    hours = f"{seconds / 3600:.2f} h"
    return f"{hours} ({seconds / 86400:.1f} days)" if seconds >= 2 * 86400 else hours


def _label(key: str) -> str:
    """``wait_mean_s`` -> ``wait mean``: the unit goes with the value."""
    return (key[:-2] if key.endswith("_s") else key).replace("_", " ")


def _show(key: str, value: Any, origin: float | None = None) -> Any:
    """A metric or meta value as a reader wants it: dates, durations, percentages."""
    if isinstance(value, (list, tuple)):
        return "; ".join(str(v) for v in value)
    if not _is_num(value):
        return value
    if key in _DATE_KEYS:
        return _date(float(value))
    if key == "last_submit_s" and origin is not None:
        return _date(origin + float(value))
    if key.endswith("_s"):
        return _duration(float(value))
    if key in _PCT_KEYS or key.startswith("sla_attainment"):
        return f"{100 * float(value):.1f}%"
    return value


def _meta_rows(results: Sequence[SimResult]) -> list[list[Any]]:
    origin = _origin(results)
    keys: list[str] = []
    for res in results:
        keys.extend(k for k in res.meta if k not in keys and k not in _META_SKIP)
    rows: list[list[Any]] = []
    for key in keys:
        shown = [str(_show(key, res.meta.get(key), origin)) for res in results]
        label = "last arrival" if key == "last_submit_s" else _label(key)
        rows.append([label, shown[0] if len(set(shown)) == 1 else " | ".join(shown)])
    return rows


def _notes(results: Sequence[SimResult]) -> list[str]:
    notes: list[str] = []
    for res in results:
        raw = res.meta.get("notes") or ()
        notes.extend(str(n) for n in raw if str(n) not in notes)
    return notes


def _metric_rows(metrics: Sequence[Mapping[str, Any]]) -> list[list[Any]]:
    keys: list[str] = []
    for m in metrics:
        keys.extend(k for k, v in m.items()
                    if k not in _SCALAR_SKIP and not isinstance(v, (dict, list)) and k not in keys)
    rows = [[_label(k), *(_show(k, m.get(k)) for m in metrics)] for k in keys]
    classes: list[str] = []
    for m in metrics:
        classes.extend(c for c in m.get("sla_attainment_by_class", {}) if c not in classes)
    rows.extend(
        [f"SLA attainment, {c}", *(_show("sla_attainment",
                                         m.get("sla_attainment_by_class", {}).get(c))
                                   for m in metrics)]
        for c in classes
    )
    return rows


def _class_rows(metrics: Sequence[Mapping[str, Any]]) -> list[list[Any]]:
    classes: list[str] = []
    for m in metrics:
        classes.extend(c for c in m.get("per_class", {}) if c not in classes)
    rows: list[list[Any]] = []
    for c in classes:
        for m in metrics:
            s = m.get("per_class", {}).get(c, {})
            rows.append([c, m.get("policy"), s.get("jobs"),
                         *(_show(k, s.get(k)) for k in ("wait_mean_s", "wait_p95_s",
                                                        "sla_attainment"))])
    return rows


def _html(results: Sequence[SimResult], metrics: Sequence[Mapping[str, Any]]) -> str:
    policies = [res.policy for res in results]
    title = "Spillway simulation: " + ", ".join(policies)
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{html.escape(title)}</title><style>{_CSS}</style></head><body>",
        f"<h1>{html.escape(title)}</h1>",
        "<h2>Trace</h2>",
        _table(["", "value"], _meta_rows(results)),
        "".join(f"<li>{html.escape(n)}</li>" for n in _notes(results)).join(("<ul>", "</ul>")),
        "<h2>Summary</h2>",
        f"<pre>{html.escape(summary_table(metrics))}</pre>",
        "<h2>Metrics</h2>",
        _table(["metric", *policies], _metric_rows(metrics)),
    ]
    for file, caption in CHARTS:
        parts.append(f"<h2>{html.escape(caption)}</h2>")
        parts.append(f'<img src="{html.escape(file)}" alt="{html.escape(caption)}">')
    parts.append("<h2>Per class</h2>")
    parts.append(_table(["class", "policy", "jobs", "wait mean", "wait p95", "SLA met"],
                        _class_rows(metrics)))
    spend = [m.get("budget_spend_usd") or {} for m in metrics]  # (a cluster file's budgets)
    if any(spend):
        teams = sorted({t for s in spend for t in s})
        parts.append("<h2>Budgets: dollars charged per team (budget_overruns must be 0)</h2>")
        parts.append(_table(["team", *policies], [[t, *(s.get(t) for s in spend)]
                                                  for t in teams]))
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


# ------------------------------------------------------------------------------------ entry


def write_report(results: Sequence[SimResult], out_dir: str | Path) -> Path:
    """Write the charts and ``index.html`` comparing ``results`` into ``out_dir`` (created if
    needed); return the path of ``index.html``. Needs matplotlib (the ``sim`` extra)."""
    try:
        import matplotlib  # noqa: F401
        from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: F401
    except ImportError as e:
        raise ConfigError("--report needs matplotlib: pip install 'spillway[sim]'") from e

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    _utilization_chart(results, out / "utilization.png")
    _queue_chart(results, out / "queue.png")
    _wait_cdf_chart(results, out / "wait_cdf.png")
    _per_team_chart(results, out / "per_team.png")
    index = out / "index.html"
    index.write_text(_html(results, [_metrics(r) for r in results]), encoding="utf-8")
    return index
