"""The jobs a simulation ran late past their deadline, with their histories (a measuring aid,
run by hand).

``python -m tests.reliability.sim_misses --cluster FILE --policy P --seed N [--busiest-days 14]
[--target-load 1.1] --json OUT`` runs one simulation as ``spillway simulate`` does (no
invariant checker) and writes each job that the run's ``deadline_misses`` counts (it ended
after its deadline, or never ended): its spec, when it ended against its deadline, and every
entry of its history (state, hours since submission, reason). docs/carbon.md found each of its
deadline fixes this way. Run it from a checkout whose ``../shared`` holds the spot traces.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from broker.energy_sim import SimEnergy
from broker.sim.engine import Simulation
from broker.sim.run import SimRequest, prepare
from policies.registry import bundle


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cluster", required=True)
    ap.add_argument("--policy", required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--busiest-days", type=float, default=14.0)
    ap.add_argument("--target-load", type=float, default=1.1)
    ap.add_argument("--json", required=True, help="where to write the jobs")
    args = ap.parse_args(argv)
    req = SimRequest(cluster=args.cluster, policies=(args.policy,),
                     busiest_days=args.busiest_days, target_load=args.target_load,
                     seed=args.seed, check=False)
    cluster, trace, _ = prepare(req)
    sim = Simulation(cluster, trace, bundle(args.policy, cluster.policies),
                     check_invariants=False, seed=args.seed,
                     energy=SimEnergy.for_trace(trace.origin))
    result = sim.run()
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


if __name__ == "__main__":
    main()
