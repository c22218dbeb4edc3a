"""Where a dispatch burst's CPU goes, per thread (a measuring aid, run by hand).

``python -m tests.reliability.dispatch_threads [--jobs 2000]`` runs ``spillway bench dispatch``
(broker.bench.suite.bench_dispatch) and adds to its JSON:

* ``thread_cpu_ms_per_start``: each scheduler and agent thread's CPU during the burst, from
  ``/proc/<pid>/task/<tid>/stat`` read just before and just after it, per job start. Threads
  are named by ``py-spy dump`` where py-spy is installed (``pip install py-spy``), else by id;
* ``phase_wall_ms_per_start`` and ``cycles_in_burst``: the scheduler's
  ``spillway_cycle_duration_seconds`` sums by phase (snapshot, plan, apply) over the burst, read
  from its ``/metrics`` (wall time: on a busy machine it includes waiting for a core).

docs/benchmarks.md gives the figures it produced.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import subprocess
import urllib.request
from typing import Any

from broker.bench import suite as bench

HZ = os.sysconf("SC_CLK_TCK")


def thread_cpu(pid: int) -> dict[int, float]:
    """CPU seconds of each thread of ``pid``."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2:].split()
        out[int(tid)] = (int(fields[11]) + int(fields[12])) / HZ
    return out


def thread_names(pid: int) -> dict[int, str]:
    """Python thread names by native id (``py-spy dump``), or nothing without py-spy."""
    spy = shutil.which("py-spy")
    if spy is None:
        return {}
    dump = subprocess.run([spy, "dump", "--pid", str(pid)], capture_output=True, text=True,
                          timeout=60, check=False).stdout
    return {int(m.group(1)): m.group(2) for m in re.finditer(r'Thread (\d+) \(\w+\): "([^"]+)"',
                                                             dump)}


def phase_sums(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    pattern = r'spillway_cycle_duration_seconds_(sum|count)\{phase="(\w+)"\} (\S+)'
    return {f"{m.group(2)}_{m.group(1)}": float(m.group(3))
            for m in re.finditer(pattern, text)}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=2000)
    jobs = parser.parse_args().jobs
    port = free_port()
    os.environ["SPILLWAY_METRICS_PORT"] = str(port)  # the scheduler's; the agents' are off
    os.environ["SPILLWAY_AGENT_METRICS_PORT"] = "0"
    seen: list[tuple[dict[int, dict[int, float]], dict[str, float]]] = []
    names: dict[int, str] = {}
    measure = bench._cpu_seconds

    def hooked(procs: list[Any], redis_pid: int | None = None) -> dict[str, float]:
        if not seen:  # just before the burst
            for p in procs:
                names.update(thread_names(p.pid))
        seen.append(({p.pid: thread_cpu(p.pid) for p in procs}, phase_sums(port)))
        out: dict[str, float] = measure(procs, redis_pid)
        return out

    bench._cpu_seconds = hooked  # type: ignore[assignment]
    result = bench.bench_dispatch(jobs=jobs)
    (before, ph0), (after, ph1) = seen[0], seen[1]
    per: dict[str, float] = {}
    for i, (pid, now) in enumerate(after.items()):
        proc = "scheduler" if i == 0 else f"agent{i - 1}"
        for tid, cpu in now.items():
            name = names.get(tid, "main" if tid == pid else str(tid))
            key = f"{proc}:{name}"
            per[key] = per.get(key, 0.0) + (cpu - before[pid].get(tid, 0.0)) * 1000 / jobs
    result["thread_cpu_ms_per_start"] = {k: round(v, 3) for k, v in
                                         sorted(per.items(), key=lambda kv: -kv[1]) if v >= 0.005}
    result["phase_wall_ms_per_start"] = {k[:-4]: round((ph1[k] - ph0.get(k, 0.0)) * 1000 / jobs,
                                                       3) for k in ph1 if k.endswith("_sum")}
    result["cycles_in_burst"] = ph1.get("plan_count", 0.0) - ph0.get("plan_count", 0.0)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
