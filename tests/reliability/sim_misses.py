"""The jobs a simulation ran late past their deadline or started past their SLA, with their
histories (a measuring aid, run by hand).

``python -m tests.reliability.sim_misses --cluster FILE --policy P --seed N [--busiest-days 14]
[--target-load 1.1] --json OUT`` runs one simulation as ``spillway simulate`` does (no
invariant checker) and writes each job that the run's ``deadline_misses`` counts (it ended
after its deadline, or never ended): its spec, when it ended against its deadline, and every
entry of its history (state, hours since submission, reason). docs/carbon.md found each of its
deadline fixes this way. Run it from a checkout whose ``../shared`` holds the spot traces.

``--sla [--classes critical,high]`` lists instead the jobs that ``sla_attainment`` counts as
misses (their first start came later than their class's SLA after submission, or never came
and the SLA had passed at the end), each with what on-prem ran when it arrived: its free GPUs,
the running jobs by class, and those of them that had come home from the cloud (eviction kind
``home``). docs/burst.md found the late ``critical`` starts of home moves this way.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from broker.model.state import EvictionKind
from broker.sim.energy import SimEnergy
from broker.sim.engine import Simulation
from broker.sim.run import SimRequest, prepare
from policies.registry import bundle


def add_sim_args(ap: argparse.ArgumentParser) -> None:
    """The arguments of one simulation run as ``spillway simulate`` runs it."""
    ap.add_argument("--cluster", required=True)
    ap.add_argument("--policy", required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--busiest-days", type=float, default=14.0,
                    help="the busiest window of this many days; 0: the whole trace")
    ap.add_argument("--target-load", type=float, default=1.1)


def simulation(args: argparse.Namespace) -> Simulation:
    """The simulation ``args`` (:func:`add_sim_args`) name, without the invariant checker."""
    req = SimRequest(cluster=args.cluster, policies=(args.policy,),
                     busiest_days=args.busiest_days or None, target_load=args.target_load,
                     seed=args.seed, check=False)
    cluster, trace, _ = prepare(req)
    return Simulation(cluster, trace, bundle(args.policy, cluster.policies),
                      check_invariants=False, seed=args.seed,
                      energy=SimEnergy.for_trace(trace.origin))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_sim_args(ap)
    ap.add_argument("--json", required=True, help="where to write the jobs")
    ap.add_argument("--sla", action="store_true",
                    help="list the jobs that started past their SLA instead")
    ap.add_argument("--classes", default="",
                    help="with --sla: only these classes (comma-separated; default all)")
    args = ap.parse_args(argv)
    sim = simulation(args)
    result = sim.run()
    if args.sla:
        classes = {c for c in args.classes.split(",") if c}
        late = sla_misses(sim, classes)
        with open(args.json, "w") as f:
            json.dump({"sla_attainment_by_class": result.metrics.get("sla_attainment_by_class"),
                       "late": late}, f, indent=1)
        print(json.dumps({"sla_attainment_by_class":
                          result.metrics.get("sla_attainment_by_class"),
                          "late": [(m["id"], m["class"], m["wait_s"]) for m in late]}))
        return
    missed: list[dict[str, Any]] = []
    for rec in sim.records.values():
        if rec.infeasible:
            continue
        due = sim._spec(sim.trace_jobs[rec.id]).deadline
        if due is None or (rec.end_s is not None and rec.end_s <= due):
            continue
        job = sim.store.get(rec.id)
        missed.append({
            "id": rec.id, "gpus": job.spec.gpus, "nodes": job.spec.nodes, "team": job.team,
            "class": job.priority, "time_limit_s": job.spec.time_limit,
            "submitted": job.submitted_at, "deadline": due, "ended": rec.end_s,
            "late_h": None if rec.end_s is None else round((rec.end_s - due) / 3600, 2),
            "state": job.state.value,
            "history": [(h.state.value, round((h.time - job.submitted_at) / 3600, 2), h.reason)
                        for h in job.history],
        })
    with open(args.json, "w") as f:
        json.dump({"deadline_misses": result.metrics.get("deadline_misses"), "missed": missed},
                  f, indent=1)
    print(json.dumps({"deadline_misses": result.metrics.get("deadline_misses"),
                      "missed": [m["id"] for m in missed]}))


def sla_misses(sim: Simulation, classes: set[str]) -> list[dict[str, Any]]:
    """The records ``sla_attainment`` counts as misses, with on-prem's state at each arrival."""
    horizon = max((r.end_s or r.submit_s for r in sim.records.values()), default=0.0)
    onprem = {n.id for n in sim.cluster.nodes}
    jobs = {j.id: j for j in (sim.store.get(i) for i in sim.records) if j is not None}
    late: list[dict[str, Any]] = []
    for rec in sim.records.values():
        if rec.infeasible or (classes and rec.priority not in classes):
            continue
        wait = (rec.first_start_s if rec.first_start_s is not None else horizon) - rec.submit_s
        if wait <= rec.sla_s:
            continue
        job = jobs[rec.id]
        t = rec.submit_s
        running: dict[str, int] = {}
        came_home: list[str] = []
        busy = 0
        for other in jobs.values():
            for a in other.attempts:
                if not (a.started_at <= t and (a.ended_at is None or a.ended_at > t)):
                    continue
                held = sum(len(al.gpu_ids) for al in a.allocations if al.node_id in onprem)
                if not held:
                    continue
                busy += held
                running[other.priority] = running.get(other.priority, 0) + held
                if any(h.kind is EvictionKind.HOME and h.time <= a.started_at
                       and h.attempt == a.number - 1 for h in other.history):
                    came_home.append(f"{other.id} ({held} GPUs, since "
                                     f"{(t - a.started_at) / 3600:.2f} h)")
        late.append({
            "id": rec.id, "class": rec.priority, "gpus": job.spec.gpus, "nodes": job.spec.nodes,
            "gpu_types": job.spec.gpu_types, "sites": job.spec.sites, "submitted": t,
            "wait_s": round(wait, 1), "sla_s": rec.sla_s,
            "onprem_free_gpus": sim.cluster.capacity_gpus - busy,
            "onprem_busy_gpus_by_class": running, "came_home_running": came_home,
            "history": [(h.state.value, round(h.time - t, 1), h.reason,
                         h.kind.value if h.kind is not None else None) for h in job.history],
        })
    return sorted(late, key=lambda m: m["submitted"])


if __name__ == "__main__":
    main()
