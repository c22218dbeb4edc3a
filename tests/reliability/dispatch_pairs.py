"""Paired dispatch runs: two checkouts of Spillway taking turns (a measuring aid, run by hand).

``python -m tests.reliability.dispatch_pairs --old DIR --new DIR [--pairs 8] [--jobs 2000]``
runs ``python -m broker.cli bench dispatch --json`` from each checkout in turn (``PYTHONPATH``
set to it, so each run imports its own code), old first, and prints one JSON document: each
run's figures (starts per second, the no-op reference, their ratio, CPU per start by process),
each pair's difference, and the means. Timings on a shared machine drift by more than most
changes (docs/benchmarks.md); the pairs' differences are what to judge a change by.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from typing import Any

KEYS = ("job_starts_per_s", "celery_noop_tasks_per_s", "job_starts_vs_celery_ratio", "failed",
        "gpu_free_gap_p50_ms", "starting_to_running_p50_ms", "running_to_end_p50_ms")


def one_run(checkout: str, jobs: int) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": os.path.abspath(checkout)}
    out = subprocess.run([sys.executable, "-m", "broker.cli", "bench", "dispatch", "--jobs",
                          str(jobs), "--json"], cwd=checkout, env=env, capture_output=True,
                         text=True, check=True, timeout=900)
    bench = json.loads(out.stdout)
    row = {k: bench[k] for k in KEYS}
    cpu = bench["burst_cpu_ms_per_start"]
    row["cpu_ms_per_start"] = {
        "scheduler": cpu["scheduler"],
        "agents": round(sum(v for k, v in cpu.items() if k.startswith("agent")
                            and not k.endswith("_jobs")), 3),
        "jobs": round(sum(v for k, v in cpu.items() if k.endswith("_jobs")), 3),
        "redis": cpu["redis"],
    }
    return row


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old", required=True, help="the checkout to compare against")
    ap.add_argument("--new", required=True, help="the checkout with the change")
    ap.add_argument("--pairs", type=int, default=8)
    ap.add_argument("--jobs", type=int, default=2000)
    args = ap.parse_args(argv)
    runs: dict[str, list[dict[str, Any]]] = {"old": [], "new": []}
    for i in range(args.pairs):
        for which in ("old", "new"):
            row = one_run(getattr(args, which), args.jobs)
            runs[which].append(row)
            print(f"pair {i + 1} {which}: {row['job_starts_per_s']} starts/s, ratio "
                  f"{row['job_starts_vs_celery_ratio']}", file=sys.stderr)
    report: dict[str, Any] = {"old": args.old, "new": args.new, "pairs": args.pairs,
                              "jobs": args.jobs, "runs": runs}
    for key in ("job_starts_per_s", "celery_noop_tasks_per_s", "job_starts_vs_celery_ratio"):
        old = [r[key] for r in runs["old"]]
        new = [r[key] for r in runs["new"]]
        report[key] = {"old_mean": round(statistics.mean(old), 3),
                       "new_mean": round(statistics.mean(new), 3),
                       "pair_differences": [round(b - a, 3) for a, b in zip(old, new)]}
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
