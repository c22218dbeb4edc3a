"""``spillway bench spot-deadline``: one job with a deadline, replayed over spot availability
traces under the deadline rule of policies/burst/spot_deadline.py, beside Greedy.

The experiment of "Can't Be Late" (Wu et al., NSDI'24), on the single-node traces of
``spot_availability_cantbelate/availability/1-node/`` (the 9 ``aws-02-15-2023`` files and the
two ``v100_1`` files of ``aws-10-26-2022``): a 48-hour job, a 0.2-hour changeover, spot at
$0.918/h against on-demand at $3.06/h, 200 evenly spaced start times per trace. Time moves in
the trace's steps; at each step spot is available or not (1 in the file: not), and a spot
machine is lost at a step without spot. Each machine start spends a changeover, billed at its
price. The cost is reported as a share of on-demand only: (work + one changeover) x the
on-demand price. A job that is not done by its deadline is a miss.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from broker.errors import ConfigError
from policies.burst.spot_deadline import DeadlineRule, Mode, SpotMarket

TRACE_GLOBS = ("aws-02-15-2023/*.json", "aws-10-26-2022/*_v100_1.json")


@dataclass(frozen=True)
class Setup:
    work_h: float = 48.0
    deadline_h: float = 52.0
    changeover_h: float = 0.2
    spot_price: float = 0.918
    ondemand_price: float = 3.06
    starts: int = 200


# (mode, slack, step, spot up, t, work done, what was seen of the market) -> mode
Decide = Callable[[Mode, float, float, bool, float, float, SpotMarket], Mode]


def ours(rule: DeadlineRule, s: Setup) -> Decide:
    return lambda mode, slack, step, up, t, done, market: rule.decide(
        mode, slack, step, up, s.work_h - done, s.deadline_h - t, market)


def greedy(d: float) -> Decide:
    """Spot whenever it is there; wait otherwise; on-demand for good once the slack is gone."""
    def decide(mode: Mode, slack: float, step: float, up: bool, t: float, done: float,
               market: SpotMarket) -> Mode:
        if mode is Mode.ONDEMAND or slack - step < d:
            return Mode.ONDEMAND
        return Mode.SPOT if up and slack - d >= d else Mode.IDLE
    return decide


def replay(avail: Sequence[bool], gap_s: float, start: int, s: Setup, decide: Decide,
           market: SpotMarket) -> tuple[float, bool]:
    """(cost, met the deadline) of one job started at step ``start``; ``market`` has seen
    the steps before the start (the scheduler watched the market before the job came) and
    is shown each step as it comes."""
    g, n = gap_s / 3600.0, len(avail)
    t = cost = change = 0.0
    left, mode, i = s.work_h, Mode.IDLE, start
    while left > 1e-9:
        up = avail[i % n]
        market.observe(up)
        if mode is Mode.SPOT and not up:
            mode, change = Mode.IDLE, 0.0  # the provider took it back; progress is kept
        new = decide(mode, s.deadline_h - t - left, g, up, t, s.work_h - left, market)
        if new is not mode:
            mode, change = new, (s.changeover_h if new is not Mode.IDLE else 0.0)
        if mode is Mode.IDLE:
            t += g
        else:
            use = min(g, change + left)
            c = min(change, use)
            change -= c
            left -= use - c
            cost += use * (s.spot_price if mode is Mode.SPOT else s.ondemand_price)
            t += use
        i += 1
    return cost, t <= s.deadline_h + 1e-9


def load(folder: str | Path) -> list[tuple[str, tuple[bool, ...], float]]:
    """The traces of the experiment under ``folder`` (the ``1-node`` directory)."""
    root = Path(folder).expanduser()
    if not root.is_dir():
        raise ConfigError(f"--traces {folder}: no such folder; give the 1-node directory of "
                          "spot_availability_cantbelate/availability")
    out = []
    for pattern in TRACE_GLOBS:
        for p in sorted(root.glob(pattern)):
            name = str(p.relative_to(root))
            try:
                doc = json.loads(p.read_text(encoding="utf-8"))
                data, gap = doc["data"], float(doc["metadata"]["gap_seconds"])
                if not data or gap <= 0:
                    raise ValueError
            except (ValueError, KeyError, TypeError):
                raise ConfigError(f"trace {name}: expected JSON with metadata.gap_seconds > 0 "
                                  "and a non-empty data list (1: no spot, 0: spot)") from None
            out.append((name, tuple(not bool(v) for v in data), gap))
    if not out:
        raise ConfigError(f"--traces {folder}: none of {', '.join(TRACE_GLOBS)} found there")
    return out


def run(folder: str | Path, s: Setup, rule: DeadlineRule | None = None) -> dict[str, Any]:
    rule = rule or DeadlineRule(changeover_h=s.changeover_h, spot_price=s.spot_price,
                                ondemand_price=s.ondemand_price)
    policies: dict[str, Decide] = {"spillway": ours(rule, s), "greedy": greedy(s.changeover_h)}
    base = (s.work_h + s.changeover_h) * s.ondemand_price
    per: dict[str, dict[str, Any]] = {}
    means: dict[str, list[float]] = {k: [] for k in policies}
    misses = dict.fromkeys(policies, 0)
    for name, avail, gap in load(folder):
        span = len(avail) - int(s.deadline_h * 3600 / gap) - 1
        if span < 1:
            raise ConfigError(f"trace {name} is shorter than the deadline")
        starts = [round(k * span / s.starts) for k in range(s.starts)]
        row: dict[str, Any] = {}
        for pol, decide in policies.items():
            costs = []
            watch = rule.market(gap / 3600.0)
            seen = max(0, starts[0] - watch.history)
            for st in starts:  # one watcher of the market, copied at each start
                for j in range(seen, st):
                    watch.observe(avail[j])
                seen = st
                cost, ok = replay(avail, gap, st, s, decide, watch.copy())
                costs.append(cost / base)
                misses[pol] += not ok
            row[pol] = round(statistics.fmean(costs), 4)
            means[pol].append(statistics.fmean(costs))
        per[name] = row
    return {"cost_vs_ondemand": round(statistics.fmean(means["spillway"]), 4),
            "deadline_misses": misses["spillway"], "per_trace": per,
            "baselines": {p: {"cost_vs_ondemand": round(statistics.fmean(v), 4),
                              "deadline_misses": misses[p]}
                          for p, v in means.items() if p != "spillway"},
            "setup": {**s.__dict__, "rule": rule.__dict__, "traces": len(per)}}
