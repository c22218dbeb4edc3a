"""``spillway bench``: the benchmarks in :mod:`broker.bench.suite`, as JSON or a small table."""

from typing import Annotated, Any

import typer
from rich.table import Table

from broker.cli.common import out, print_json
from broker.cli.root import app

bench = typer.Typer(help="Benchmarks: the scheduling cycle, dispatch through real "
                         "processes, the CLI's own speed.", no_args_is_help=True)
app.add_typer(bench, name="bench")

Opt = typer.Option


def _show(result: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print_json(result)
        return
    table = Table(header_style="bold", box=None, show_header=False)
    table.add_column(style="bold")
    table.add_column(justify="right")
    for key, value in result.items():
        table.add_row(str(key), str(value))
    out.print(table)


@bench.command("cycle")
def cycle(
    pending: Annotated[int, Opt("--pending", help="Pending jobs in the queue.")] = 10000,
    nodes: Annotated[int, Opt("--nodes", help="Nodes in the cluster.")] = 1000,
    gpus_per_node: Annotated[int, Opt("--gpus-per-node", help="GPUs per node.")] = 8,
    cycles: Annotated[int, Opt("--cycles", help="Cycles to time.")] = 20,
    seed: Annotated[int, Opt("--seed", help="Random seed of the synthetic workload.")] = 0,
    store: Annotated[bool, Opt("--store", help="Also time whole cycles through a real "
                                               "(embedded) Redis store.")] = False,
    policy: Annotated[str, Opt("--policy", help="spillway, slurm-like or fcfs.")] = "spillway",
    as_json: Annotated[bool, Opt("--json", help="Print JSON.")] = False,
) -> None:
    """Time the pure scheduling cycle on a synthetic queue and cluster."""
    from broker.bench.suite import bench_cycle
    from policies.registry import BUNDLES

    if policy not in BUNDLES:
        from broker.errors import ConfigError

        raise ConfigError(f"--policy {policy}: unknown; allowed: {', '.join(sorted(BUNDLES))}")
    _show(bench_cycle(pending=pending, nodes=nodes, gpus_per_node=gpus_per_node,
                      cycles=cycles, seed=seed, store=store, policy=policy), as_json)


@bench.command("dispatch")
def dispatch(
    jobs: Annotated[int, Opt("--jobs", help="Trivial jobs to run.")] = 2000,
    agents: Annotated[int, Opt("--agents", help="Worker agent processes.")] = 2,
    gpus_per_agent: Annotated[int, Opt("--gpus-per-agent", help="GPUs per agent.")] = 8,
    as_json: Annotated[bool, Opt("--json", help="Print JSON.")] = False,
) -> None:
    """Run trivial jobs through a real scheduler and agents on an embedded Redis."""
    from broker.bench.suite import bench_dispatch

    _show(bench_dispatch(jobs=jobs, agents=agents, gpus_per_agent=gpus_per_agent), as_json)


@bench.command("cli")
def cli(
    runs: Annotated[int, Opt("--runs", min=1, help="Times each command is spawned.")] = 20,
    as_json: Annotated[bool, Opt("--json", help="Print JSON.")] = False,
) -> None:
    """Time `spillway --help`, `queue`, `show JOB` and `explain JOB`, each spawned as a fresh
    process, against a real store: a fresh embedded Redis (target: a median under 0.4 s)."""
    from broker.bench.cli import bench_cli

    result = bench_cli(runs=runs)
    if as_json:
        print_json(result)
        return
    _show({**{f"{name} median / p90 s": f"{c['median_s']} / {c['p90_s']}"
              for name, c in result["commands"].items()},
           "python -c pass median s": result["python_startup"]["median_s"],
           "reading floor median s": result["reading_floor"]["median_s"],
           "target s": result["target_s"], "met": result["met"]}, False)


@bench.command("spot-deadline")
def spot_deadline(
    traces: Annotated[str, Opt("--traces", help="The 1-node folder of the Can't Be Late "
                                                "availability traces.")
                      ] = "../shared/data/spot_availability_cantbelate/availability/1-node",
    deadline_hours: Annotated[float, Opt("--deadline-hours", help="Deadline after the start."
                                         )] = 52.0,
    work_hours: Annotated[float, Opt("--work-hours", help="The job's work.")] = 48.0,
    changeover_hours: Annotated[float, Opt("--changeover-hours", help="Each machine start."
                                           )] = 0.2,
    spot_price: Annotated[float, Opt("--spot-price", help="$/h.")] = 0.918,
    ondemand_price: Annotated[float, Opt("--ondemand-price", help="$/h.")] = 3.06,
    starts: Annotated[int, Opt("--starts", help="Evenly spaced start times per trace.")] = 200,
    replay: Annotated[bool, Opt("--replay", help="Only the standalone replay of the rule "
                                "(seconds), not the simulator (the figures of record).")
                      ] = False,
    as_json: Annotated[bool, Opt("--json", help="Print JSON.")] = False,
) -> None:
    """One job with a deadline on spot, over availability traces, each start a simulation
    of the cluster's burst policy (docs/burst.md); the standalone replay beside it."""
    import sys

    from broker.bench import deadline_sim
    from broker.bench.deadline import Setup, run
    from broker.errors import ConfigError

    if not (0 < work_hours <= deadline_hours) or starts < 1 or changeover_hours < 0:
        raise ConfigError("--work-hours must be > 0 and at most --deadline-hours; --starts "
                          ">= 1; --changeover-hours >= 0")
    setup = Setup(work_hours, deadline_hours, changeover_hours, spot_price, ondemand_price,
                  starts)
    if replay:
        result = run(traces, setup)
        greedy = result["baselines"]["greedy"]
    else:
        result = deadline_sim.run(traces, setup, progress=lambda m: print(
            m, file=sys.stderr, flush=True))
        greedy = result["replay"]["greedy"]
    if as_json:
        print_json(result)
        return
    _show({"cost_vs_ondemand": result["cost_vs_ondemand"],
           "deadline_misses": result["deadline_misses"],
           **({} if replay else {"replay": result["replay"]["cost_vs_ondemand"],
                                 "wall_s": result["wall_s"]}),
           **{f"greedy {k}": v for k, v in greedy.items()}}, False)


@bench.command("carbon-shift")
def carbon_shift(
    data: Annotated[str, Opt("--data", help="The Let's Wait Awhile series (ger_ci.csv, "
                                            "gb_ci.csv, fr_ci.csv).")
                    ] = "../shared/data/carbon_letswaitawhile_2020",
    country: Annotated[str, Opt("--country", help="DE, GB or FR.")] = "DE",
    deadline: Annotated[str, Opt("--deadline", help="next-workday or semi-weekly.")
                        ] = "next-workday",
    interruptible: Annotated[bool, Opt("--interruptible", help="Jobs may pause and resume "
                                                               "(checkpointed).")] = False,
    forecast_error: Annotated[float, Opt("--forecast-error", help="White noise on the "
                                         "forecast, SD as a share of the series' mean.")] = 0.0,
    seed: Annotated[int, Opt("--seed", help="Seed of the job generation (0: the paper's).")
                    ] = 0,
    noise_seed: Annotated[int, Opt("--noise-seed", help="First seed of the forecast noise.")
                          ] = 0,
    repeats: Annotated[int, Opt("--repeats", help="Noisy forecasts averaged.")] = 10,
    spatial: Annotated[bool, Opt("--spatial", help="Jobs may also run in the other two "
                                                   "countries.")] = False,
    days: Annotated[int | None, Opt("--days", help="Only the jobs of the first N days of "
                                                   "2020 (a slice).")] = None,
    through_sim: Annotated[bool, Opt("--through-sim", help="Every decision by the "
                                     "simulator's scheduling cycles (slower: use --days).")
                           ] = False,
    as_json: Annotated[bool, Opt("--json", help="Print JSON.")] = False,
) -> None:
    """Carbon time-shifting on the ML-training scenario of "Let's Wait Awhile"
    (docs/carbon-shifting.md)."""
    from broker.bench.carbon import DEADLINES, FILES, Setup, run
    from broker.errors import ConfigError

    if country.upper() not in FILES:
        raise ConfigError(f"--country {country!r}: allowed: {', '.join(FILES)}")
    if deadline not in DEADLINES:
        raise ConfigError(f"--deadline {deadline!r}: allowed: {', '.join(DEADLINES)}")
    if not 0 <= forecast_error <= 1 or repeats < 1:
        raise ConfigError("--forecast-error must be between 0 and 1 (e.g. 0.05); --repeats >= 1")
    if days is not None and days < 1:
        raise ConfigError(f"--days {days}: allowed: a whole number >= 1")
    _show(run(data, Setup(country.upper(), deadline, interruptible,  # type: ignore[arg-type]
                          forecast_error, seed, noise_seed, repeats, spatial, days=days,
                          through_sim=through_sim)), as_json)
