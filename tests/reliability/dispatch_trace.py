"""Where a start's time goes on its way from the cycle to a running process (a measuring aid,
run by hand).

``python -m tests.reliability.dispatch_trace [--jobs 2000]`` runs ``spillway bench dispatch``
with every scheduler and agent process timing a few of its calls (a ``sitecustomize`` module
put on their ``PYTHONPATH`` wraps them; nothing in the product changes) and adds to the bench's
JSON:

* ``calls_ms``: each traced call's count, p50 and mean wall time (snapshot, plan, apply, the
  start commands' send, the agent's start, its read of the jobs and seals, ``spawn_many``,
  the report of the starts);
* ``timeline_ms``: for each started job, when each step began or ended, counted from the
  start of the snapshot of the cycle that started it (the job's STARTING time), p50 and mean:
  the path a GPU waits along between being planned and running its next job.

Wall times: on a busy machine they include waiting for a core. docs/benchmarks.md gives the
figures it produced.
"""

from __future__ import annotations

import argparse
import bisect
import glob
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections import defaultdict
from typing import Any

# Loaded by every Python process of the bench whose PYTHONPATH holds it and whose environment
# has DISPATCH_TRACE_DIR: one JSON line per call (tag, began, ended, job ids).
SITECUSTOMIZE = '''
import json, os, threading, time
_dir = os.environ.get("DISPATCH_TRACE_DIR")
if _dir:
    _out = open(os.path.join(_dir, f"{os.getpid()}.jsonl"), "a", buffering=1)
    _lock = threading.Lock()

    def _wrap(owner, name, tag, ids, of_result=False):
        inner = getattr(owner, name)

        def traced(*args, **kwargs):
            began, result = time.time(), None
            try:
                result = inner(*args, **kwargs)
                return result
            finally:
                ended = time.time()
                try:  # (the job ids: of the call's arguments, or of what it returned)
                    which = list(ids(result if of_result else args))[:64]
                except Exception:
                    which = []
                with _lock:
                    _out.write(json.dumps([tag, began, ended, which]) + "\\n")
        setattr(owner, name, traced)

    import broker.bus.commands, broker.cycle.snapshots, broker.control.loop, broker.store.base
    import broker.store.redis, workers.agent, workers.channel, workers.runner
    _wrap(broker.cycle.snapshots.SnapshotBuilder, "build", "snapshot", lambda a: ())
    _wrap(broker.control.loop, "run_cycle", "plan", lambda a: ())
    _wrap(broker.store.base.BaseStore, "apply", "apply", lambda a: [s.job_id for s in a[1].starts])
    _wrap(broker.bus.commands, "start_jobs", "send", lambda a: [j.id for j in a[1]])
    _wrap(workers.agent.Agent, "start_jobs", "agent_start", lambda a: [i[0] for i in a[1]])
    _wrap(workers.channel.RedisChannel, "view", "agent_read", lambda v: list(v.jobs),
          of_result=True)
    _wrap(workers.runner.Supervisor, "spawn_many", "spawn", lambda a: [i[0].id for i in a[1]])
    _wrap(workers.agent.Agent, "_report_started", "report", lambda a: [p.job_id for p in a[1]])
'''

#: (name, traced call, its start or its end): the steps of a start, in order
STEPS = (("apply_began", "apply", 1), ("apply_ended", "apply", 2),
         ("send_began", "send", 1), ("send_ended", "send", 2),
         ("agent_received", "agent_start", 1), ("agent_read_jobs", "agent_read", 2),
         ("spawn_began", "spawn", 1), ("spawn_ended", "spawn", 2),
         ("report_began", "report", 1))


def analyse(trace_dir: str) -> dict[str, Any]:
    """``calls_ms`` and ``timeline_ms`` from the trace files of one run."""
    calls: dict[str, list[tuple[float, float, list[str]]]] = defaultdict(list)
    for path in glob.glob(os.path.join(trace_dir, "*.jsonl")):
        with open(path) as f:
            for line in f:
                tag, began, ended, ids = json.loads(line)
                calls[tag].append((began, ended, ids))

    def stats(xs: list[float]) -> dict[str, float]:
        return {"p50": round(statistics.median(xs) * 1000, 2),
                "mean": round(statistics.mean(xs) * 1000, 2)} if xs else {}

    out: dict[str, Any] = {"calls_ms": {
        tag: {"n": len(rs), **stats([e - b for b, e, _ in rs])} for tag, rs in calls.items()}}
    first: dict[str, dict[str, tuple[float, float]]] = {}
    for tag, rs in calls.items():
        seen = first[tag] = {}
        for began, ended, ids in rs:
            for job_id in ids:
                seen.setdefault(job_id, (began, ended))
    snaps = sorted(b for b, _, _ in calls.get("snapshot", []))
    steps: dict[str, list[float]] = defaultdict(list)
    for job_id, (applied, _) in first.get("apply", {}).items():
        if not all(job_id in first.get(call, {}) for _, call, _ in STEPS):
            continue  # (a start refused, or one whose agent reported nothing yet)
        k = bisect.bisect_right(snaps, applied) - 1
        if k < 0:
            continue
        for name, call, which in STEPS:
            steps[name].append(first[call][job_id][which - 1] - snaps[k])
    out["timeline_ms"] = {name: stats(steps[name]) for name, _, _ in STEPS}
    out["jobs_traced"] = len(steps.get("report_began", []))
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=2000)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="spillway-trace-") as tmp:
        site, traces = os.path.join(tmp, "site"), os.path.join(tmp, "traces")
        os.makedirs(site)
        os.makedirs(traces)
        with open(os.path.join(site, "sitecustomize.py"), "w") as f:
            f.write(SITECUSTOMIZE)
        env = {**os.environ, "DISPATCH_TRACE_DIR": traces,
               "PYTHONPATH": os.pathsep.join(p for p in (site, os.getcwd(),
                                                         os.environ.get("PYTHONPATH")) if p)}
        run = subprocess.run([sys.executable, "-m", "broker.cli", "bench", "dispatch", "--jobs",
                              str(args.jobs), "--json"], env=env, capture_output=True,
                             text=True, check=True)
        result = json.loads(run.stdout)
        result.update(analyse(traces))
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
