"""``spillway bench cli``: how long the everyday commands take, each one a fresh process.

A CLI command's time is mostly Python starting and importing; this measures it the way a
person meets it: ``spillway --help``, ``spillway queue``, ``spillway show JOB`` and
``spillway explain JOB``, each spawned ``runs`` times (turn about, so a slow moment of the
machine falls on all of them alike) against a real store: a fresh embedded Redis (or
``redis_url``, whose database is flushed) holding one node of 8 GPUs, a dozen jobs and one
scheduling cycle's plan, so that ``queue`` lists running and pending jobs and ``explain``
reads a real reason and queue position. Two floors are timed beside them: ``python -c pass``
(no command goes under it; a gauge of the machine's speed at the time) and the imports that a
command reading the store cannot do without (Redis's client, Typer and Rich, and pydantic's
models: a job's spec is one). Each command's CPU
time (user and system, median) is given beside its wall time: on a machine shared with other
work, the wall time waits for a core and the CPU time much less.
"""

from __future__ import annotations

import os
import resource
import statistics
import subprocess
import sys
import time
from typing import Any

TARGET_S = 0.4
COMMANDS: tuple[tuple[str, ...], ...] = (("--help",), ("queue",), ("show", "{job}"),
                                         ("explain", "{job}"))
FLOORS = {"python -c pass": "pass",
          "reading floor": "import redis, typer, rich.console; from pydantic import BaseModel"}


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _cluster(url: str) -> str:
    """One node of 8 A100s, 12 jobs, one scheduling cycle applied; a pending job's id."""
    from broker.cycle.scheduler import run_cycle
    from broker.cycle.snapshots import SnapshotBuilder
    from broker.model import Gpu, JobSpec, Node
    from broker.store.redis import RedisStore
    from policies.registry import PolicySet

    store = RedisStore(url)
    try:
        store.redis.flushdb()
        now = time.time()
        gpus = tuple(Gpu(f"GPU-bench-cli-{g}", g, "A100-80GB", 80.0) for g in range(8))
        store.heartbeat(Node("bench-cli-0", gpus), 3600.0, now)
        specs = [JobSpec(command=["python", "train.py", f"--part={i}"], gpus=(1, 2, 4)[i % 3],
                         team=("vision", "nlp")[i % 2], priority=("normal", "high")[i % 2],
                         name=f"bench-{i}", time_limit=7200.0) for i in range(12)]
        jobs = store.submit_many(specs, now)
        builder = SnapshotBuilder(store)
        store.apply(run_cycle(builder.build(now), PolicySet.named("spillway"),
                              memory=builder.memory), now)
        pending = [j for j in store.list_jobs({j.state for j in jobs}) if j.pending_reason]
        return (pending or jobs)[-1].id
    finally:
        store.close()


def _cpu() -> float:
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def _time(argv: list[str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one run of ``argv``; RuntimeError if it fails."""
    cpu0, t0 = _cpu(), time.perf_counter()
    done = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                          stdin=subprocess.DEVNULL, check=False)
    took, cpu = time.perf_counter() - t0, _cpu() - cpu0
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[2:])} exited {done.returncode}: "
                           f"{done.stderr.decode(errors='replace').strip()[-500:]}")
    return took, cpu


def _stats(runs: list[tuple[float, float]], target_s: float | None = None) -> dict[str, Any]:
    times = [wall for wall, _ in runs]
    median = statistics.median(times)
    out = {"median_s": round(median, 3), "p90_s": round(_pct(times, 0.9), 3),
           "min_s": round(min(times), 3), "max_s": round(max(times), 3),
           "cpu_median_s": round(statistics.median(cpu for _, cpu in runs), 3)}
    return out if target_s is None else {**out, "target_s": target_s, "met": median < target_s}


def bench_cli(runs: int = 20, redis_url: str | None = None, target_s: float = TARGET_S
              ) -> dict[str, Any]:
    """Spawn each command of :data:`COMMANDS` ``runs`` times as ``python -m broker.cli``;
    per command the median, p90, min and max seconds, and whether the median is under
    ``target_s``."""
    import shutil
    import tempfile

    from broker.control.embedded import EmbeddedRedis

    tmp = tempfile.mkdtemp(prefix="spillway-bench-cli-")
    server = None if redis_url else EmbeddedRedis(tmp)
    url = redis_url or server.url  # type: ignore[union-attr]
    try:
        job = _cluster(url)
        base = [sys.executable, "-m", "broker.cli"]
        argvs = {" ".join(c).replace("{job}", "JOB"):
                 base + ([] if c == ("--help",) else ["--redis-url", url])
                 + [a.replace("{job}", job) for a in c] for c in COMMANDS}
        floors = {name: [sys.executable, "-c", code] for name, code in FLOORS.items()}
        every = {**argvs, **floors}
        for argv in every.values():  # (warm: bytecode written, files in the cache)
            _time(argv)
        load = os.getloadavg()[0]
        times: dict[str, list[tuple[float, float]]] = {name: [] for name in every}
        for _ in range(runs):
            for name, argv in every.items():
                times[name].append(_time(argv))
        commands = {f"spillway {name}": _stats(times[name], target_s) for name in argvs}
        return {
            "runs": runs,
            "commands": commands,
            "python_startup": _stats(times["python -c pass"]),
            "reading_floor": {"code": FLOORS["reading floor"],
                              **_stats(times["reading floor"])},
            "target_s": target_s,
            "met": all(c["met"] for c in commands.values()),
            "load_average_before": round(load, 2),
            "load_average_after": round(os.getloadavg()[0], 2),
            "cpus": os.cpu_count(),
            "python": sys.version.split()[0],
        }
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(tmp, ignore_errors=True)
