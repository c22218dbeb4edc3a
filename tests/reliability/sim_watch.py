"""What each cycle of a simulation decided about a few jobs (a measuring aid, run by hand).

``python -m tests.reliability.sim_watch --cluster FILE --policy P --seed N [--busiest-days 14]
[--target-load 1.1] --jobs ID,ID [--until-h H]`` runs one simulation as ``spillway simulate``
does (no invariant checker) and prints, as JSON lines, for each watched job: every change of
its pending reason, the cycle that started it, every launch made for it, and the evictions
planned while it waited (``t_h``: hours into the trace). ``--until-h`` stops the run there.
docs/burst.md found why two ``critical`` jobs started late with home moves this way (find them
first with ``python -m tests.reliability.sim_misses --sla``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
from typing import Any

import broker.sim.engine as engine
from broker.cycle.plan import Plan
from tests.reliability.sim_misses import add_sim_args, simulation


class _Stop(Exception):
    pass


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_sim_args(ap)
    ap.add_argument("--jobs", required=True, help="the job ids to watch, comma-separated")
    ap.add_argument("--until-h", type=float, default=None)
    ap.add_argument("--every", action="store_true",
                    help="print every cycle while a watched job waits, with all its starts")
    args = ap.parse_args(argv)
    watch = set(args.jobs.split(","))
    last: dict[str, str] = {}
    inner = engine.run_cycle

    def out(now: float, **kv: Any) -> None:
        print(json.dumps({"t_h": round(now / 3600, 4), **kv}), flush=True)

    def run_cycle(snap: Any, policy: Any, now: float, memory: Any) -> Plan:
        plan: Plan = inner(snap, policy, now, memory)
        if args.until_h is not None and now > args.until_h * 3600:
            raise _Stop
        waiting = [j for j in watch if j in plan.pending]
        for j in waiting:
            r = plan.pending[j]
            text = f"{r.code}: {r.message}"
            if last.get(j) != text or args.every:
                last[j] = text
                out(now, job=j, pending=text,
                    onprem_free=_onprem_free(snap))
        for s in plan.starts:
            if s.job_id in watch:
                out(now, job=s.job_id, start=[a.node_id for a in s.allocations])
        for launch in plan.launches:
            if watch & set(launch.for_jobs):
                out(now, launch=launch.offer_id, count=launch.count, for_jobs=launch.for_jobs)
        if waiting and args.every and plan.starts:
            by_id = {j.id: j for j in snap.pending}
            out(now, starts=[(s.job_id, by_id[s.job_id].priority if s.job_id in by_id
                              else None, by_id[s.job_id].attempt if s.job_id in by_id else None,
                              [a.node_id for a in s.allocations]) for s in plan.starts])
        if waiting and plan.preemptions:
            out(now, evictions=[(p.job_id, p.kind.value if p.kind else None, p.reason)
                                for p in plan.preemptions])
        return plan

    engine.run_cycle = run_cycle  # type: ignore[assignment]
    sim = simulation(args)
    with contextlib.suppress(_Stop):
        sim.run()


def _onprem_free(snap: Any) -> int:
    nodes = {n.id: n for n in snap.nodes if n.site == "onprem"}
    return sum(len(n.allocatable) for n in nodes.values()) - sum(
        len(a) for n, a in snap.allocated.items() if n in nodes)


if __name__ == "__main__":
    main()
