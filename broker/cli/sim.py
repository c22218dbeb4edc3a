"""``spillway simulate``: replay a workload trace on a simulated cluster under some policies."""

import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.text import Text

from broker.cli.common import err, out, print_json, table_width
from broker.cli.root import app
from broker.errors import ConfigError

if TYPE_CHECKING:
    from broker.sim.engine import Progress, ProgressFn

Opt = typer.Option
REPORT_NEEDS = ("--report needs matplotlib, which `pip install -e .` leaves out: "
                "pip install -e '.[sim]' (or pip install 'spillway[sim]'), then run again")


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def progress_line(p: "Progress") -> str:
    """One run's progress, under 80 columns:
    ``fcfs         jobs 1,234/3,210  sim 2017-10-05 14:00 (day 1.3)  wall 12 s``."""
    when = datetime.fromtimestamp(p.origin + p.sim_s, tz=timezone.utc).strftime("%Y-%m-%d %H:%M")
    state = "done in" if p.done else "wall"
    return (f"{p.policy:<12} jobs {p.arrived:,}/{p.total:,}  sim {when} "
            f"(day {p.sim_s / 86400:.1f})  {state} {_duration(p.wall_s)}")


@contextmanager
def _progress(policies: tuple[str, ...]) -> Iterator["ProgressFn | None"]:
    """A progress callback drawing one line per policy on stderr, or None when stderr is not
    a terminal (piped, redirected, under a test runner): then nothing is drawn."""
    if not err.is_terminal:
        yield None
        return
    from rich.live import Live

    lines = {p: f"{p:<12} waiting for a CPU" for p in policies}
    with Live(Text(""), console=err, refresh_per_second=4, transient=False) as live:
        last = [0.0]

        def show(p: "Progress") -> None:
            lines[p.policy] = progress_line(p)
            now = time.monotonic()
            if p.done or now - last[0] >= 0.25:
                last[0] = now
                live.update(Text("\n".join(lines.values())))

        yield show
        live.update(Text("\n".join(lines.values())))


def _check_report_deps() -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise ConfigError(REPORT_NEEDS) from None


@app.command()
def simulate(
    trace: Annotated[str, Opt("--trace", help="'philly' (shipped) or a CSV file.")] = "philly",
    fmt: Annotated[str | None, Opt("--format", help="philly or csv (default: by header).")
                   ] = None,
    cluster: Annotated[str, Opt("--cluster", help="A shipped cluster by name (seed-160, "
                                                  "small-mig) or a cluster YAML file.")
                       ] = "seed-160",
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
    lower_bound: Annotated[bool, Opt("--lower-bound", help="Add each run's offline lower "
                                     "bound (an LP; docs/lower-bound.md) to the JSON.")
                           ] = False,
    lower_bound_slot: Annotated[float, Opt("--lower-bound-slot", help="Its time slot in "
                                           "seconds (finer: tighter, slower).")] = 900.0,
    lower_bound_no_pause: Annotated[bool, Opt("--lower-bound-no-pause", help="Also the "
                                              "tighter bound in which every job the run never "
                                              "stopped runs whole (slower).")] = False,
    oracle_runtimes: Annotated[bool, Opt("--oracle-runtimes", help="Plan with every job's "
                                         "true runtime instead of the predictor's estimate "
                                         "(what runtime knowledge is worth; "
                                         "docs/lower-bound.md).")] = False,
) -> None:
    """Replay a trace through the production scheduling cycle, with a virtual clock."""
    from broker.sim.metrics import summary_table
    from broker.sim.run import SimRequest, write_json
    from broker.sim.run import simulate as run

    req = SimRequest(trace=trace, fmt=fmt, cluster=cluster,
                     policies=tuple(p.strip() for p in policy.split(",") if p.strip()),
                     start=start, end=end, busiest_days=busiest_days, load_scale=load_scale,
                     target_load=target_load, seed=seed, check=check,
                     lower_bound=lower_bound or lower_bound_no_pause,
                     lower_bound_slot_s=lower_bound_slot,
                     lower_bound_no_pause=lower_bound_no_pause,
                     oracle_runtimes=oracle_runtimes)
    if report is not None:
        _check_report_deps()  # before minutes of simulation, not after
    with _progress(req.policies) as show:
        results = run(req, progress=show)
    if json_out is not None:
        write_json(results, json_out)
    if report is not None:
        from broker.sim.report import write_report

        err.print(f"report: {write_report(results, report)}")
    if as_json:
        print_json(results[0].metrics if len(results) == 1 else
                   {"runs": [r.metrics for r in results]})
    else:
        # blocks of columns that fit the terminal; whole rows, one a policy, in a pipe
        out.print(summary_table([r.metrics for r in results], width=table_width()),
                  markup=False, soft_wrap=True)
    for note in dict.fromkeys(n for r in results for n in r.metrics.get("cloud_notes", [])):
        err.print(f"warning: {note}", markup=False, soft_wrap=True)
    if any(r.metrics.get("invariant_violations") for r in results):
        raise typer.Exit(1)
