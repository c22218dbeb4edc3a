"""Researcher commands: submit, queue, show, cancel, logs, explain."""

import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from broker.cli.common import (
    EXIT_FAIL,
    err,
    fail,
    fmt_duration,
    out,
    parse_pairs,
    print_fitted,
    print_json,
    settings,
    spec_error,
    table_width,
)
from broker.cli.render import explanation_panel, job_panel, jobs_table
from broker.cli.root import app
from broker.errors import FieldError, JobNotFound, SpecError
from broker.model.state import ACTIVE, JobState

if TYPE_CHECKING:
    from broker.model import Job

Opt = typer.Option
# A JobSpec's numbers come in as text and are checked with the rest of the spec (`--gpus two`:
# "gpus: 'two' is not a whole number", with every other problem at once, as for `--gpus -1`);
# the help still names the type each takes
INTEGER, FLOAT = "INTEGER", "FLOAT"

# CLI option -> JobSpec field, for the options that map one to one.
_FIELDS = {
    "name": "name", "workdir": "workdir", "gpus": "gpus", "min_gpu_memory": "min_gpu_memory_gb",
    "mig": "mig_profile", "cpus": "cpus", "memory": "memory_gb", "nodes": "nodes",
    "priority": "priority", "team": "team", "time_limit": "time_limit", "deadline": "deadline",
    "checkpoint_dir": "checkpoint_dir", "sites": "sites", "max_price": "max_price_per_hour",
}


def _load_file(path: Path) -> dict[str, Any]:
    import yaml

    try:
        data = yaml.safe_load(path.read_text())
    except OSError as e:
        raise spec_error("file", f"cannot read {path}: {e.strerror}") from None
    except yaml.YAMLError as e:
        raise spec_error("file", f"{path} is not valid YAML: {e}") from None
    if not isinstance(data, dict):
        raise spec_error("file", f"{path} must hold a mapping of JobSpec fields")
    return data


@app.command(context_settings={"allow_interspersed_args": False})
def submit(
    ctx: typer.Context,
    command: Annotated[list[str] | None, typer.Argument(
        help="The command and its arguments (put `--` before it if it starts with '-').",
        show_default=False)] = None,
    cmd: Annotated[str | None, Opt("--cmd", help="The command as one shell string "
                                                 "(run with /bin/sh -c).")] = None,
    file: Annotated[Path | None, Opt("-f", "--file", help="A YAML file of JobSpec fields; "
                                                          "options override it.")] = None,
    gpus: Annotated[str | None, Opt("--gpus", "-g", help="GPUs per node (0-64) (default: 1)",
                                    metavar=INTEGER, show_default=False)] = None,
    gpu_type: Annotated[list[str] | None, Opt(
        "--gpu-type", help="Allowed GPU family or model (A100, H100-80GB...); repeatable.")] = None,
    min_gpu_memory: Annotated[str | None, Opt("--min-gpu-memory", metavar=FLOAT,
                                              help="Minimum GB per GPU.")] = None,
    mig: Annotated[str | None, Opt("--mig", help="MIG profile (1g.10gb...); then --gpus "
                                                 "counts MIG instances.")] = None,
    cpus: Annotated[str | None, Opt("--cpus", help="CPUs per node (default: 1)",
                                    metavar=FLOAT, show_default=False)] = None,
    memory: Annotated[str | None, Opt("--memory", metavar=FLOAT,
                                      help="Memory per node, GB.")] = None,
    nodes: Annotated[str | None, Opt("--nodes", help="Nodes (a gang when > 1) (default: 1)",
                                     metavar=INTEGER, show_default=False)] = None,
    priority: Annotated[str | None, Opt("--priority", "-p",
                                        help="Priority class (critical, high, normal, low).")
                        ] = None,
    team: Annotated[str | None, Opt("--team", "-t", help="Team to charge.")] = None,
    time_limit: Annotated[str | None, Opt("--time-limit",
                                          help="30m, 6h, 1h30m, 2d, HH:MM:SS or seconds.")
                          ] = None,
    deadline: Annotated[str | None, Opt("--deadline",
                                        help="ISO 8601 time (UTC if no zone) or epoch.")] = None,
    checkpoint_dir: Annotated[str | None, Opt("--checkpoint-dir",
                                              help="Where the job saves checkpoints.")] = None,
    sites: Annotated[str | None, Opt("--sites", help="Comma list of onprem, cloud, spot.")
                     ] = None,
    max_price: Annotated[str | None, Opt("--max-price", metavar=FLOAT,
                                         help="Most dollars per hour to pay in the cloud.")
                         ] = None,
    env: Annotated[list[str] | None, Opt("--env", "-e", help="KEY=VALUE; repeatable.")] = None,
    label: Annotated[list[str] | None, Opt("--label", help="KEY=VALUE; repeatable.")] = None,
    workdir: Annotated[str | None, Opt("--workdir", help="Working directory of the job.")
                       ] = None,
    name: Annotated[str | None, Opt("--name", "-n", help="A name to recognise the job by.")
                    ] = None,
    hold_if_infeasible: Annotated[bool | None, Opt(
        "--hold-if-infeasible/--refuse-if-infeasible",
        help="Queue the job even if no registered node could ever hold it (e.g. before the "
             "nodes register); default: the hold_if_infeasible setting (false: refused)",
        show_default=False)] = None,
    wait: Annotated[bool, Opt("--wait", help="Wait until the job ends; exit 0 only if it "
                                             "succeeded.")] = False,
    as_json: Annotated[bool, Opt("--json", help="Print the job as JSON.")] = False,
) -> None:
    """Submit a job and print its id.

    Example: spillway submit --gpus 4 -p high -t vision -- python train.py --lr 3e-4
    """
    data: dict[str, Any] = _load_file(file) if file else {}
    problems: list[FieldError] = []
    if command and cmd:
        problems.append(FieldError("command", "give the command as arguments or with --cmd, "
                                              "not both"))
    if command:
        data["command"] = list(command)
    elif cmd:
        data["command"] = cmd
    given = locals()
    for opt, fld in _FIELDS.items():
        if given[opt] is not None:
            data[fld] = given[opt]
    if gpu_type:
        data["gpu_types"] = list(gpu_type)
    for opt_items, fld in ((env, "env"), (label, "labels")):
        try:
            if opt_items:
                data[fld] = {**(data.get(fld) or {}), **parse_pairs(opt_items, fld)}
        except SpecError as e:
            problems += e.errors
    from broker.model import JobSpec

    s = settings(ctx)
    try:  # report every problem at once: the options' and the spec's
        JobSpec.parse(data, s.config)
    except SpecError as e:
        problems += e.errors
    if problems:
        raise SpecError(problems)
    client = s.client()
    job = client.submit(data, hold_if_infeasible=hold_if_infeasible)
    if not wait:
        print_json(job.to_dict()) if as_json else out.print(job.id)
        return
    err.print(f"{job.id} submitted; waiting for it to end (Ctrl-C stops waiting, not the job)")
    out.print(job.id) if not as_json else None
    final = client.wait(job.id)
    if as_json:
        print_json(final.to_dict())
    else:
        out.print(ended_line(final))
    if final.state is not JobState.SUCCEEDED:
        raise typer.Exit(EXIT_FAIL)


def ended_line(job: "Job") -> str:
    """How a job ended, in one line: its state, the cause in words, its exit code
    (``j-... FAILED: TimeLimit, it ran past its time limit (1h00m) and was stopped (exit code
    143)``)."""
    code = "" if job.exit_code is None else f" (exit code {job.exit_code})"
    why = job.history[-1].reason if job.history else ""
    why = re.sub(r" \(exit -?\d+\)$", "", why)  # (the exit code is said once, at the end)
    if job.state is JobState.SUCCEEDED or why.lower() in ("", "exited", job.state.value.lower()):
        return f"{job.id} {job.state.value}{code}"
    words = {
        "TimeLimit": "it ran past its time limit "
                     f"({fmt_duration(job.spec.time_limit)}) and was stopped",
        "OutOfMemory": "it used more than its memory_gb and the kernel killed it",
        "Signal": "a signal killed it",
        "GangPartFailed": "another part of its gang failed",
    }.get(why.split(" ", 1)[0].rstrip(":"))
    return f"{job.id} {job.state.value}: {why}{', ' + words if words else ''}{code}"


@app.command()
def queue(
    ctx: typer.Context,
    state: Annotated[list[str] | None, Opt("--state", "-s",
                                           help="Only these states (repeatable or comma list).")
                     ] = None,
    team: Annotated[str | None, Opt("--team", "-t", help="Only this team.")] = None,
    priority: Annotated[str | None, Opt("--priority", "-p", help="Only this class.")] = None,
    all_: Annotated[bool, Opt("--all", "-a", help="Include finished jobs.")] = False,
    limit: Annotated[int | None, Opt("--limit", help="Only the newest N (default with --all: "
                                                     "100 a page).")] = None,
    page: Annotated[int, Opt("--page", min=1, help="With --limit (or --all): page N, newest "
                                                   "first.")] = 1,
    as_json: Annotated[bool, Opt("--json", help="Print JSON (a list of jobs).")] = False,
) -> None:
    """List jobs: queued and running by default; --all for finished ones too."""
    if state:
        states: Any = state
    elif all_:
        states = None
    else:
        states = {JobState.PENDING, *ACTIVE}
    if all_ and limit is None:
        limit = 100
    skip = (page - 1) * limit if limit is not None else 0
    jobs = settings(ctx).client().list(states, team=team, priority=priority, limit=limit,
                                       skip=skip)
    if as_json:
        print_json([j.to_dict() for j in jobs])
        return
    if not jobs:
        err.print("no jobs" + ("" if all_ or state else " queued or running (--all shows "
                                                        "finished ones)"))
        return
    width = table_width()
    print_fitted(jobs_table(jobs, width=width), width)


@app.command()
def show(
    ctx: typer.Context,
    job_id: Annotated[str, typer.Argument(metavar="JOB", help="Job id.")],
    as_json: Annotated[bool, Opt("--json", help="Print the job record as JSON.")] = False,
) -> None:
    """Show one job: its spec, state, placement and history."""
    job = settings(ctx).client().get(job_id)
    if as_json:
        print_json(job.to_dict())
    else:
        out.print(job_panel(job))


@app.command()
def cancel(
    ctx: typer.Context,
    job_ids: Annotated[list[str], typer.Argument(metavar="JOB...", help="Job ids.")],
    as_json: Annotated[bool, Opt("--json", help="Print the jobs as JSON.")] = False,
) -> None:
    """Cancel jobs.

    Queued jobs end at once; running ones get SIGTERM, the grace period, then SIGKILL.
    Cancelling a finished job changes nothing.
    """
    client = settings(ctx).client()
    done, missing = [], 0
    for job_id in job_ids:
        try:
            job = client.cancel(job_id)
        except JobNotFound as e:
            err.print(f"[red]error:[/] {e}")
            missing += 1
            continue
        done.append(job)
        if not as_json:
            note = {JobState.STOPPING: " (stopping: SIGTERM sent, then the grace period)",
                    JobState.CANCELLED: ""}.get(job.state, " (already finished)")
            out.print(f"{job.id} {job.state.value}{note}")
    if as_json:
        print_json([j.to_dict() for j in done])
    if missing:
        raise typer.Exit(EXIT_FAIL)


@app.command()
def logs(
    ctx: typer.Context,
    job_id: Annotated[str, typer.Argument(metavar="JOB", help="Job id.")],
    follow: Annotated[bool, Opt("--follow", "-f", help="Keep printing until the job ends.")
                      ] = False,
    attempt: Annotated[int | None, Opt("--attempt", help="Attempt number (default: the "
                                                         "current one).")] = None,
    as_json: Annotated[bool, Opt("--json", help="One JSON object per line.")] = False,
) -> None:
    """Print a job's output (stdout, and stderr lines to stderr)."""
    import json

    client = settings(ctx).client()
    if attempt is not None:
        had = client.get(job_id).attempt
        if not 1 <= attempt <= had:
            raise fail(f"job {job_id} has no attempt {attempt}; it has had {had} (--attempt "
                       f"{'1' if had == 1 else f'1 to {had}'} or leave it out for the current "
                       "one)")
    try:
        for line in client.logs(job_id, attempt=attempt, follow=follow):
            if as_json:
                sys.stdout.write(json.dumps({"cursor": line.cursor, "time": line.time,
                                             "stream": line.stream, "text": line.text}) + "\n")
            else:
                stream = sys.stderr if line.stream == "err" else sys.stdout
                stream.write(line.text if line.text.endswith("\n") else line.text + "\n")
            if follow:
                sys.stdout.flush()
                sys.stderr.flush()
    except KeyboardInterrupt:
        raise typer.Exit(130) from None


@app.command()
def explain(
    ctx: typer.Context,
    job_id: Annotated[str, typer.Argument(metavar="JOB", help="Job id.")],
    as_json: Annotated[bool, Opt("--json", help="Print JSON.")] = False,
) -> None:
    """Why is my job still pending? (or where it runs, or how it ended)"""
    e = settings(ctx).client().explain(job_id)
    if as_json:
        print_json(e.to_dict())
    else:
        out.print(explanation_panel(e))
