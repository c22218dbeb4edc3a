"""``spillway fidelity``: one trace window on the real system and in the simulator, compared."""

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from broker.cli.common import err, out
from broker.cli.root import app

Opt = typer.Option
_ROWS = (("wait mean", "wait_mean_s"), ("wait p50", "wait_p50_s"), ("wait p95", "wait_p95_s"),
         ("busy util", "busy_utilization"), ("util", "utilization"),
         ("Jain", "jain_fairness"), ("SLA", "sla_attainment"), ("preemptions", "preemptions"),
         ("started", "started"), ("cloud cost", "cloud_cost_usd"), ("bursts", "bursts"),
         ("cloud GPU h", "cloud_gpu_hours"))  # (cloud rows: a cluster with cloud sites)


def _num(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return "-" if v is None else str(v)


def summary(data: dict[str, Any]) -> str:
    """The comparison as text: metrics side by side, the correlation, the most divergent jobs
    and the load."""
    lines = [f"{data['policy']}: {data['jobs']} jobs, {data['agents']} agents, time scale "
             f"{data['time_scale']:g}, horizon {data['horizon_s']:.0f} s (trace time)",
             f"{'metric':<12} {'real':>10} {'sim':>10} {'diff':>8} {'sim-ideal':>10} "
             f"{'diff':>8}"]
    for label, key in _ROWS:
        if key not in data["real"]:
            continue
        d, di = data["diff"].get(key), data["diff_ideal"].get(key)
        lines.append(f"{label:<12} {_num(data['real'].get(key)):>10} "
                     f"{_num(data['sim'].get(key)):>10} "
                     f"{'-' if d is None else f'{100 * d:+.1f}%':>8} "
                     f"{_num(data['sim_ideal'].get(key)):>10} "
                     f"{'-' if di is None else f'{100 * di:+.1f}%':>8}")
    pj = data["per_job"]
    lines.append(f"start rank correlation {_num(data['start_rank_correlation'])}; same first "
                 f"node {_num(pj['same_first_node'])}, same attempts "
                 f"{_num(pj['same_attempts'])}")
    site = pj.get("site")
    if site:
        lines.append(f"jobs on cloud: real {site['on_cloud_real']}, sim {site['on_cloud_sim']}; "
                     f"same site (on-prem or cloud) {site['same_site']} of {site['compared']}")
    lines.append("delays measured (real s): " + ", ".join(
        f"{k} {v:g}" for k, v in data["latencies_real_s"].items()))
    load = data["load"]
    dl = load["dispatch_latency_s"]
    lines.append(f"load: dispatch p50/p95/p99 {_num(dl['p50'])}/{_num(dl['p95'])}/"
                 f"{_num(dl['p99'])} s; redis {load['redis_used_memory_mb']['max']} MB; "
                 f"machine load {load['machine_load_1m']['start']} -> "
                 f"{load['machine_load_1m']['end']}; submit lag max "
                 f"{_num(load['submit_lag_s']['max'])} s")
    if not data.get("real_kept_up", True):
        lines.append("the real run did not keep up with the replay (a job did not run, or was "
                     "submitted more than a scheduling period late): compare at a smaller K")
    lines.append("most divergent jobs:")
    for row in pj["divergent"][:5]:
        lines.append(f"  {row['id']}  {row['delta_s']:+.0f} s  {row['reason']}")
    return "\n".join(lines)


@app.command()
def fidelity(
    trace: Annotated[str, Opt("--trace", help="'philly' (shipped) or a CSV file.")] = "philly",
    cluster: Annotated[str, Opt("--cluster", help="A shipped cluster by name or a cluster "
                                                  "YAML file (cloud sites run as local "
                                                  "providers).")
                       ] = "seed-160",
    policy: Annotated[str, Opt("--policy", help="spillway, slurm-like or fcfs.")] = "spillway",
    start: Annotated[str | None, Opt("--from", help="Keep jobs submitted at or after (ISO).")
                     ] = None,
    end: Annotated[str | None, Opt("--to", help="Keep jobs submitted before (ISO).")] = None,
    busiest_days: Annotated[float | None, Opt("--busiest-days", help="The busiest window of "
                                              "this many days instead.")] = None,
    load_scale: Annotated[float | None, Opt("--load-scale", help="Divide the gaps between "
                                            "arrivals by X.")] = None,
    target_load: Annotated[float | None, Opt("--target-load", help="Or pick X so the offered "
                                             "load is this share of the GPUs.")] = None,
    time_scale: Annotated[float, Opt("--time-scale", help="K: divide every duration by K "
                                     "(100: a one-hour job runs 36 s).")] = 100.0,
    seed: Annotated[int, Opt("--seed", help="Seed of derived time limits and classes.")] = 0,
    json_out: Annotated[Path | None, Opt("--json", help="Write the comparison as JSON here.")
                        ] = None,
    report: Annotated[Path | None, Opt("--report", help="Write the charts of the real run, "
                                       "the simulator and the ideal simulator here.")] = None,
    workdir: Annotated[Path | None, Opt("--workdir", help="Keep the real run's logs and "
                                        "files here (default: a temporary directory).")
                       ] = None,
) -> None:
    """Replay a trace window on the real system (real Redis, scheduler, one agent per node,
    real job processes) and in the simulator, time-scaled by K, and compare them."""
    from broker.cli.sim import _check_report_deps
    from broker.fidelity.run import FidelityRequest, run_fidelity
    from broker.sim.run import SimRequest

    if report is not None:
        _check_report_deps()
    policies = tuple(p.strip() for p in policy.split(",") if p.strip())
    req = FidelityRequest(SimRequest(trace=trace, cluster=cluster, policies=policies,
                                     start=start, end=end, busiest_days=busiest_days,
                                     load_scale=load_scale, target_load=target_load,
                                     seed=seed), time_scale=time_scale, workdir=workdir)
    data, results = run_fidelity(req, say=lambda line: err.print(line, markup=False))
    if json_out is not None:
        json_out.write_text(json.dumps(data, indent=1, allow_nan=False) + "\n")
    if report is not None:
        from broker.sim.report import write_report

        err.print(f"report: {write_report(results, report)}")
    out.print(summary(data), markup=False, soft_wrap=True)
