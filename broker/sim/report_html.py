"""The HTML page of a simulation report (broker/sim/report.py): the trace, the summary, the
metrics of each policy side by side, the charts (broker/sim/report_charts.py) and the per-class
and budget tables, with dates, durations and percentages written as a reader wants them.
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from typing import Any

from broker.sim.metrics import summary_table
from broker.sim.report_charts import CHARTS, is_num, origin_of, utc_date
from broker.sim.types import SimResult

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
    if not is_num(value):
        return value
    if key in _DATE_KEYS:
        return utc_date(float(value))
    if key == "last_submit_s" and origin is not None:
        return utc_date(origin + float(value))
    if key.endswith("_s"):
        return _duration(float(value))
    if key in _PCT_KEYS or key.startswith("sla_attainment"):
        return f"{100 * float(value):.1f}%"
    return value


def _meta_rows(results: Sequence[SimResult]) -> list[list[Any]]:
    origin = origin_of(results)
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


def page(results: Sequence[SimResult], metrics: Sequence[Mapping[str, Any]]) -> str:
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
