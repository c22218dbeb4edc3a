"""``spillway simulate``: replay a workload trace on a simulated cluster under some policies."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from broker.cli.common import err, out, print_json
from broker.cli.root import app

Opt = typer.Option


@app.command()
def simulate(
    trace: Annotated[str, Opt("--trace", help="'philly' (shipped) or a CSV file.")] = "philly",
    fmt: Annotated[str | None, Opt("--format", help="philly or csv (default: by header).")
                   ] = None,
    cluster: Annotated[str, Opt("--cluster", help="Cluster YAML (nodes, classes, teams).")
                       ] = "examples/clusters/seed-160.yaml",
    policy: Annotated[str, Opt("--policy", help="spillway, slurm-like, fcfs; several "
                                                "comma-separated run side by side.")
                      ] = "spillway",
    start: Annotated[str | None, Opt("--from", help="Keep jobs submitted at or after (ISO).")
                     ] = None,
    end: Annotated[str | None, Opt("--to", help="Keep jobs submitted before (ISO).")] = None,
    busiest_days: Annotated[float | None, Opt("--busiest-days", help="Replay the busiest "
                                              "window of this many days instead.")] = None,
    load_scale: Annotated[float | None, Opt("--load-scale", help="Divide the gaps between "
                                            "arrivals by X (X < 1 spreads the trace out).")
                          ] = None,
    target_load: Annotated[float | None, Opt("--target-load", help="Or pick X so the "
                                             "offered load is this share of the GPUs (1.1).")
                           ] = None,
    seed: Annotated[int, Opt("--seed", help="Seed of derived time limits and classes.")] = 0,
    json_out: Annotated[Path | None, Opt("--json", help="Write the metrics as JSON here.")
                        ] = None,
    report: Annotated[Path | None, Opt("--report", help="Write PNG charts and index.html "
                                                        "here.")] = None,
    check: Annotated[bool, Opt("--check/--no-check", help="Run the invariant checker.")
                     ] = True,
    as_json: Annotated[bool, Opt("--print-json", help="Print the metrics JSON to stdout.")
                       ] = False,
) -> None:
    """Replay a trace through the production scheduling cycle, with a virtual clock."""
    from broker.sim.metrics import summary_table
    from broker.sim.run import SimRequest, write_json
    from broker.sim.run import simulate as run

    req = SimRequest(trace=trace, fmt=fmt, cluster=cluster,
                     policies=tuple(p.strip() for p in policy.split(",") if p.strip()),
                     start=start, end=end, busiest_days=busiest_days, load_scale=load_scale,
                     target_load=target_load, seed=seed, check=check)
    results = run(req)
    if json_out is not None:
        write_json(results, json_out)
    if report is not None:
        from broker.sim.report import write_report

        err.print(f"report: {write_report(results, report)}")
    if as_json:
        print_json(results[0].metrics if len(results) == 1 else
                   {"runs": [r.metrics for r in results]})
    else:
        out.print(summary_table([r.metrics for r in results]))
    if any(r.metrics.get("invariant_violations") for r in results):
        raise typer.Exit(1)
