"""The bursting comparison of docs/burst.md: ``spillway`` against the baselines on
``seed-160-burst.yaml``, per window and seed, from ``spillway simulate --json`` files.

    python -m broker.sim.burst_compare RUN.json [RUN.json ...] [--onprem ONPREM.json ...]
        [--json OUT.json]

Each RUN.json holds the runs of one window and seed (``--policy spillway,burst-immediate,
burst-timer,cloud-cheapest``); each ONPREM.json (optional) the ``spillway`` run of the same
window and seed on ``seed-160`` (no cloud), for the on-prem utilisation check. Targets
(issue 19): ``spillway``'s ``cloud_cost_usd`` at most 0.70 x ``burst-immediate``'s and 0.85 x
``burst-timer``'s (the mean over seeds; no seed more than 0.03 over), its SLA attainment over
the classes that may burst at least 0.99 and no lower than either baseline's, ``jobs_lost``
and ``jobs_failed`` 0, no invariant violation, on-prem busy utilisation no lower than without
the cloud.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

KEYS = ("cloud_cost_usd", "cloud_gpu_hours", "idle_instance_hours", "bursts",
        "spot_interruptions", "spot_moves", "jobs_lost", "jobs_failed", "deadline_misses",
        "sla_attainment", "sla_attainment_may_burst", "busy_utilization", "invariant_violations",
        "wall_s")
TARGETS = {"burst-immediate": 0.70, "burst-timer": 0.85}
SLACK = 0.03


def _runs(path: str) -> list[dict[str, Any]]:
    data = json.loads(Path(path).read_text())
    return list(data["runs"]) if "runs" in data else [data]


def _key(run: Mapping[str, Any]) -> tuple[str, int]:
    meta = run.get("meta", {})
    window = "two-months"
    if meta.get("busiest_window_offered_gpus") is not None:
        days = (meta.get("window_end", 0.0) - meta.get("window_start", 0.0)) / 86400
        window = f"busiest-{round(days)}d" if days > 0 else "busiest-14d"
    return window, int(meta.get("seed", 0))


def compare(paths: Sequence[str], onprem: Sequence[str] = ()) -> dict[str, Any]:
    rows: dict[tuple[str, int], dict[str, Any]] = {}
    for p in paths:
        for run in _runs(p):
            rows.setdefault(_key(run), {})[run["policy"]] = {k: run.get(k) for k in KEYS}
    base = {_key(r): r.get("busy_utilization") for p in onprem for r in _runs(p)}
    out: dict[str, Any] = {"windows": {}}
    for (window, seed), pols in sorted(rows.items()):
        sp = pols.get("spillway")
        if sp is None:
            continue
        entry: dict[str, Any] = {"runs": pols, "ratios": {}, "checks": {}}
        for name in TARGETS:
            other = pols.get(name)
            if other and other["cloud_cost_usd"]:
                entry["ratios"][f"cost_vs_{name}"] = round(
                    sp["cloud_cost_usd"] / other["cloud_cost_usd"], 4)
        att = sp["sla_attainment_may_burst"] or 0.0
        entry["checks"] = {
            "attainment_at_least_0.99": att >= 0.99,
            "attainment_no_lower_than_baselines": all(
                att >= (pols[n]["sla_attainment_may_burst"] or 0.0) for n in TARGETS if n in pols),
            "jobs_lost_0": all(r["jobs_lost"] == 0 for r in pols.values()),
            "jobs_failed_0": all(not r.get("jobs_failed") for r in pols.values()),
            "no_violations": all(not r["invariant_violations"] for r in pols.values()),
        }
        alone = base.get((window, seed))
        if alone is not None:
            entry["onprem_busy_utilization_without_cloud"] = alone
            entry["checks"]["onprem_busy_util_not_lower"] = \
                sp["busy_utilization"] >= float(alone) - 1e-4
        out["windows"].setdefault(window, {})[f"seed {seed}"] = entry
    for seeds in out["windows"].values():
        summary: dict[str, Any] = {}
        for name, target in TARGETS.items():
            vals = [s["ratios"][f"cost_vs_{name}"] for s in seeds.values()
                    if f"cost_vs_{name}" in s["ratios"]]
            if vals:
                summary[f"cost_vs_{name}_mean"] = round(statistics.fmean(vals), 4)
                summary[f"cost_vs_{name}_ok"] = statistics.fmean(vals) <= target and all(
                    v <= target + SLACK for v in vals)
        summary["all_checks"] = all(all(s["checks"].values()) for s in seeds.values())
        seeds["summary"] = summary
    return out


def _table(result: Mapping[str, Any]) -> str:
    lines = []
    for window, seeds in result["windows"].items():
        lines.append(f"== {window}")
        for seed, entry in seeds.items():
            if seed == "summary":
                lines.append(f"   summary: {json.dumps(entry)}")
                continue
            for pol, r in entry["runs"].items():
                lines.append(f"   {seed} {pol:16s} cost ${r['cloud_cost_usd']:>10,.0f}  "
                             f"SLA(may burst) {r['sla_attainment_may_burst']}  "
                             f"bursts {r['bursts']}  spot int. {r['spot_interruptions']}  "
                             f"moves {r.get('spot_moves')}  "
                             f"lost {r['jobs_lost']}  busy util {r['busy_utilization']}")
            lines.append(f"   {seed} ratios {entry['ratios']} checks {entry['checks']}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m broker.sim.burst_compare",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", help="spillway simulate --json files")
    ap.add_argument("--onprem", nargs="*", default=[], help="the same windows on seed-160")
    ap.add_argument("--json", help="write the comparison here")
    args = ap.parse_args(argv)
    result = compare(args.runs, args.onprem)
    print(_table(result))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
