"""``spillway demo``: a local cluster, a small mixed workload, a live table, a summary; by
default with a ``local`` cloud that the workload overflows into (broker/cli/demo_cloud.py). The
workload, the live board and the summary are in broker/cli/demo_board.py."""

import os
import signal
import tempfile
import time
import uuid
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.live import Live
from rich.markup import escape

from broker.cli import demo_cloud
from broker.cli.common import EXIT_FAIL, err, out, redacted, settings
from broker.cli.demo_board import Board, DemoJob, closing_notes, say, summary, workload
from broker.cli.ops import _Stop, install_stop_handlers
from broker.cli.root import app
from broker.model.state import TERMINAL

# Faster timings than production, for a demo on one machine (the environment still wins).
DEMO_TIMINGS = {
    "SPILLWAY_HEARTBEAT_S": "1",
    "SPILLWAY_LEASE_TTL_S": "3",
    "SPILLWAY_CYCLE_S": "0.5",
    "SPILLWAY_RECONCILE_S": "0.5",
    "SPILLWAY_GRACE_S": "5",
}


@app.command()
def demo(
    ctx: typer.Context,
    jobs: Annotated[int, typer.Option("--jobs", "-n", min=1, max=500,
                                      help="How many jobs to run.")] = 12,
    gpus: Annotated[str, typer.Option("--gpus", help="The worker's static GPU inventory.")
                    ] = "8xA100-80GB",
    timeout: Annotated[float, typer.Option("--timeout", help="Give up after this many "
                                                             "seconds of workload.")] = 120.0,
    no_cloud: Annotated[bool, typer.Option("--no-cloud", help="On-prem only: no local cloud, "
                                                              "the default classes.")] = False,
) -> None:
    """Run a small mixed workload on a local cluster, live, then shut down.

    Starts Redis, a scheduler and a worker, submits jobs of several classes and sizes (one
    fails on purpose, one is cancelled while running), shows a live table and a summary. By
    default a local cloud rents machines (worker processes here) when on-prem is full and a
    high job's SLA would break, and gives them back once idle; --no-cloud runs on-prem only.
    """
    from broker.client import Client
    from broker.control.embedded import LocalCluster

    for key, value in DEMO_TIMINGS.items():
        os.environ.setdefault(key, value)
    s = settings(ctx)
    cloud = not no_cloud
    configured = s.redis_url or s.config.redis_url
    install_stop_handlers()
    # Everything the demo makes (Redis, logs, config, the agents' and the machines' state and
    # job directories) lives in this directory, removed when the demo ends however it ends
    tmp = tempfile.TemporaryDirectory(prefix="spillway-demo-", ignore_cleanup_errors=True)
    code = 0
    client = None
    cluster = None
    try:
        here = Path(tmp.name)
        config_path = str(s.config_path) if s.config_path else None
        if cloud:
            config_path = str(demo_cloud.write_config(here, config_path))
        cluster = LocalCluster(here, redis_url=configured, gpus=gpus, cpus=64,
                               node_id=f"demo-{uuid.uuid4().hex[:6]}", config_path=config_path,
                               env={"SPILLWAY_STATE_DIR": str(here / "state")},
                               stop_timeout=s.config.grace_s + 10,
                               cloud="local" if cloud else None)
        with err.status("starting Redis, the scheduler and a worker..."):
            cluster.start()
        kind = "embedded, stops with the demo" if cluster.embedded else "configured"
        say(f"Redis {redacted(cluster.url)} ({kind}); worker {cluster.node_id} with {gpus}",
            out.width)
        config = s.config
        if cloud:
            from broker.config.core import load_config

            config = load_config(config_path, env={})
            say(demo_cloud.intro(), out.width)
        client = Client(cluster.url, config)
        board = Board(client, cluster.node_id, gpus, cloud=cloud)
        code = _run(board, workload(jobs, cloud), _gpu_count(gpus), timeout, cluster)
        if board.done:
            notes = closing_notes(list(board.jobs.values()), config, backfill=not cloud)
            if board.machines is not None:
                notes[-1:-1] = demo_cloud.notes(board.machines, list(board.jobs.values()),
                                                cluster.node_id)
            for note in notes:
                out.print()
                say(note, out.width)
    except (KeyboardInterrupt, _Stop):
        err.print("interrupted; shutting down")
        code = 130
    finally:  # another Ctrl-C or SIGTERM must not cut the cleanup short: cloud machines
        # are sessions of their own and outlive the demo unless stop() gives them back (and
        # Ctrl-C stays ignored until the demo has exited: it is ending anyway)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if cluster is not None and code not in (0, 130):  # the logs go with the directory
            for child in cluster.children:
                err.print(f"--- {child.name} log (last lines) ---\n{escape(child.tail(30))}")
        if client is not None:
            client.close()
        if cluster is not None:
            cluster.stop()
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        tmp.cleanup()
    raise typer.Exit(code)


def _run(board: Board, plan: list[DemoJob], onprem_gpus: int, timeout: float,
         cluster: Any) -> int:
    """Submit the plan (the second wave once on-prem is full), show it live until every job
    has ended and every rented machine is given back, then the summary; the exit code."""
    board.submit([p for p in plan if p.wave == 1])
    later = [p for p in plan if p.wave != 1]
    deadline = time.monotonic() + timeout
    with Live(board.render(out.width), console=out, refresh_per_second=4) as live:
        while not (board.settled and not later) and time.monotonic() < deadline:
            board.poll()
            if later and board.onprem_full(onprem_gpus):
                board.submit(later)
                later = []
            live.update(board.render(out.width))
            time.sleep(0.25)
        board.poll()
        live.update(board.render(out.width))
    left = demo_cloud.machines_left(cluster)
    table, wrong = summary(board, left)
    out.print()
    out.print(table)
    if not board.settled or later:
        left_jobs = [j.id for j in board.jobs.values() if j.state not in TERMINAL]
        what = f"{len(left_jobs)} job(s) still not finished ({', '.join(left_jobs)})" \
            if left_jobs or later else "cloud machines still not given back"
        err.print(f"[red]error:[/] {what} after {timeout:g}s; logs in {cluster.log_dir}")
        return EXIT_FAIL
    if wrong:
        err.print("[red]unexpected outcomes:[/] " + escape("; ".join(wrong)))
        return EXIT_FAIL
    out.print("[green]every job ended as planned[/] (one failed and one was cancelled on "
              "purpose)")
    if board.machines is not None:
        c = board.machines.counts()
        out.print(f"cloud: {c['launched']} machine(s) rented and {c['released']} given back "
                  f"when idle; {left} left running")
    return 0


def _gpu_count(inventory: str) -> int:
    from broker.model.gpus import parse_inventory

    return sum(e.count for e in parse_inventory(inventory))
