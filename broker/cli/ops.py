"""Operator commands: status, nodes, drain, resume, scheduler, worker, up (the status screen is
broker/cli/status_view.py)."""

import signal
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape

from broker.cli.common import (
    err,
    fail,
    fmt_duration,
    out,
    parse_pairs,
    print_fitted,
    print_json,
    redacted,
    settings,
    spec_error,
    table_width,
)
from broker.cli.render import nodes_table
from broker.cli.root import app
from broker.cli.status_view import status_data, status_screen

Opt = typer.Option


@app.command()
def status(
    ctx: typer.Context,
    as_json: Annotated[bool, Opt("--json", help="Print JSON (one object).")] = False,
) -> None:
    """One screen: the leading scheduler, nodes, the queue by class, running jobs, cloud."""
    data = status_data(settings(ctx).client())
    if as_json:
        print_json(data)
    else:
        out.print(status_screen(data, out.width))


@app.command()
def nodes(
    ctx: typer.Context,
    as_json: Annotated[bool, Opt("--json", help="Print JSON (a list of nodes).")] = False,
    forget: Annotated[list[str] | None, Opt(
        "--forget", metavar="NODE", help="Remove a dead node (repeatable): it leaves the list "
        "and no longer counts when submit asks whether a job could ever run. Refused for a "
        "live node (stop its agent first) and one that holds jobs (see --force).")] = None,
    force: Annotated[bool, Opt("--force", help="With --forget: requeue the jobs still "
                               "recorded on the dead node, then forget it.")] = False,
) -> None:
    """List worker nodes: state, GPUs free/total by model, running jobs, last heartbeat."""
    if forget:
        forget_nodes(settings(ctx).client(), forget, force)
        return
    if force:
        raise spec_error("force", "--force goes with --forget NODE", "nodes --forget NODE "
                         "--force")
    views = settings(ctx).client().nodes()
    if as_json:
        print_json([v.to_dict() for v in views])
    elif not views:
        err.print("no nodes registered; start one with `spillway worker` (or `spillway up`)")
    else:
        width = table_width()
        print_fitted(nodes_table(views, width), width)  # (a pipe: one line a node)
        dead = [v for v in views if v.lease_left_s <= 0]
        if dead:
            forget_after = settings(ctx).config.node_forget_after_s
            err.print(f"[dim]{len(dead)} node(s) dead ({escape(', '.join(v.id for v in dead))}"
                      f"); submit stops counting one {fmt_duration(forget_after)} after its "
                      "last heartbeat (node_forget_after_s); `spillway nodes --forget NODE` "
                      "removes one now[/]")


def forget_nodes(client: Any, node_ids: list[str], force: bool) -> None:
    """``nodes --forget``: each node forgotten, or one line saying why not (exit 1; an unknown
    node: exit 2, naming the registered ones)."""
    from broker.errors import NodeNotFound

    for node_id in node_ids:
        try:
            lost = client.forget_node(node_id, force=force)
        except NodeNotFound:
            known = ", ".join(n.id for n in client.store.nodes()) or "none registered"
            raise spec_error("node", f"{node_id!r} is not a registered node", known) from None
        out.print(f"{escape(node_id)} FORGOTTEN"
                  + (f" (requeued: {escape(', '.join(j.id for j in lost))})" if lost else ""))


@app.command()
def drain(
    ctx: typer.Context,
    node_ids: Annotated[list[str], typer.Argument(help="Node ids (see `spillway nodes`).")],
) -> None:
    """Stop placing jobs on nodes; their running jobs run to their end (`resume` undoes it)."""
    client = settings(ctx).client()
    for node_id in node_ids:
        client.drain(node_id)
        out.print(f"{node_id} DRAINING")


@app.command()
def resume(
    ctx: typer.Context,
    node_ids: Annotated[list[str], typer.Argument(help="Node ids (see `spillway nodes`).")],
) -> None:
    """Let drained nodes take jobs again."""
    client = settings(ctx).client()
    for node_id in node_ids:
        client.resume(node_id)
        out.print(f"{node_id} READY")


@app.command()
def scheduler(
    ctx: typer.Context,
    loglevel: Annotated[str, Opt("--loglevel", "-l", help="DEBUG, INFO, WARNING or ERROR.")
                        ] = "WARNING",
    no_provisioner: Annotated[bool, Opt("--no-provisioner", help="Leave cloud launches to a "
                                        "`spillway provisioner` process.")] = False,
) -> None:
    """Run the scheduler: scheduling cycles and the reconciler (and, with cloud providers
    configured, the provisioner: launches, terminations, the machines' lifecycle).

    Run one or several: one leads (a lease in Redis, renewed while it works; its fencing
    token guards every write), the others take over within the lease if it dies.
    """
    from broker.control.leader import run_scheduler

    s = settings(ctx)
    url = s.url()
    c = s.config
    err.print(f"spillway scheduler on {redacted(url)}: cycle every {c.cycle_s:g}s and on "
              f"triggers, reconcile every {c.reconcile_s:g}s, leader lease {c.leader_lease_s:g}s")
    raise typer.Exit(run_scheduler(url, c, loglevel=loglevel,
                                   provisioner=not no_provisioner))


@app.command()
def worker(
    ctx: typer.Context,
    node_id: Annotated[str | None, Opt("--node-id", help="Node id (default: the hostname)",
                                       show_default=False)] = None,
    gpus: Annotated[str | None, Opt("--gpus", help="Static GPU inventory instead of NVML, "
                                                   "e.g. 8xA100-80GB or 4xA100-80GB,2xT4.")
                    ] = None,
    inventory: Annotated[Path | None, Opt("--inventory", help="Static inventory file "
                                                              "(YAML) instead of NVML.")] = None,
    cpus: Annotated[float | None, Opt("--cpus", help="CPUs to offer (default: all)",
                                      show_default=False)] = None,
    memory: Annotated[float | None, Opt("--memory", help="Memory to offer, GB "
                                                         "(default: all)",
                                        show_default=False)] = None,
    label: Annotated[list[str] | None, Opt("--label", help="KEY=VALUE node label; "
                                                           "repeatable.")] = None,
    site: Annotated[str, Opt("--site", help="onprem, or the cloud site this host is in.")
                    ] = "onprem",
    work_dir: Annotated[Path | None, Opt("--work-dir", help="Where job directories and "
                                                            "agent state go.")] = None,
    instance_id: Annotated[str, Opt("--instance-id", envvar="SPILLWAY_INSTANCE_ID",
                                    help="The cloud machine this host is (its provider id); "
                                         "set by the machine's boot script.")] = "",
    loglevel: Annotated[str, Opt("--loglevel", "-l", help="DEBUG, INFO, WARNING or ERROR.")
                        ] = "INFO",
    redis_url_file: Annotated[Path | None, Opt(
        "--redis-url-file", envvar="SPILLWAY_REDIS_URL_FILE", dir_okay=False,
        help="A file (mode 0600) holding the agent's Redis URL, so that no password sits in "
             "its environment or command line.", show_default=False)] = None,
) -> None:
    """Run the worker agent on this GPU host: registers the node, heartbeats, runs jobs."""
    import logging

    logging.basicConfig(level=loglevel.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        from workers.service import run_agent
    except ImportError as e:  # pragma: no cover (the agent ships with the package)
        raise fail(f"the worker agent cannot be imported ({e}); reinstall spillway") from None
    from broker.store.reach import url_from_file

    s = settings(ctx)
    url = url_from_file(str(redis_url_file), "--redis-url-file") if redis_url_file \
        else s.url()  # (a ConfigError: one line, exit 1)
    code = run_agent(url, s.config, node_id=node_id, gpus=gpus,
                     inventory=str(inventory) if inventory else None, cpus=cpus,
                     memory_gb=memory, labels=parse_pairs(label, "label") or None, site=site,
                     work_dir=str(work_dir) if work_dir else None, instance_id=instance_id)
    raise typer.Exit(int(code or 0))


class _Stop(Exception):
    pass


def _raise_stop(signum: int, frame: object) -> None:
    raise _Stop(signal.Signals(signum).name)


def install_stop_handlers() -> None:
    """SIGTERM (and SIGHUP) stop the local cluster the same way Ctrl-C does."""
    signal.signal(signal.SIGTERM, _raise_stop)
    signal.signal(signal.SIGHUP, _raise_stop)


def up_hints(cluster: Any, offer_id: str | None) -> list[str]:
    """What `spillway up` prints as next steps: each line under "In another shell:" works as
    it is in a fresh shell (the exports first: the cluster's Redis, and its configuration
    file where it runs with one, e.g. the generated config-cloud.yaml of --cloud local)."""
    import shlex

    lines = ["In another shell:",
             f"  [bold]export SPILLWAY_REDIS_URL={escape(cluster.export_value())}[/]"]
    if cluster.config_path:
        where = shlex.quote(str(Path(cluster.config_path).expanduser().resolve()))
        lines.append(f"  [bold]export SPILLWAY_CONFIG={escape(where)}[/]")
    lines += ["  spillway submit --gpus 1 -- sh -c 'echo $CUDA_VISIBLE_DEVICES'",
              "  spillway queue"]
    if offer_id is not None:
        lines += ["  spillway offers --provider local",
                  f"  spillway launch {escape(shlex.quote(offer_id))}",
                  "  spillway instances"]
    return [*lines, "Ctrl-C stops everything."]


@app.command()
def up(
    ctx: typer.Context,
    gpus: Annotated[str, Opt("--gpus", help="The worker's static GPU inventory.")
                    ] = "8xA100-80GB",
    cpus: Annotated[int, Opt("--cpus", help="The worker's CPUs.")] = 64,
    node_id: Annotated[str | None, Opt("--node-id", help="The worker's node id.")] = None,
    port: Annotated[int | None, Opt("--port", help="Port for the embedded Redis "
                                                   "(default: a free one)",
                                    show_default=False)] = None,
    state_dir: Annotated[Path | None, Opt("--state-dir", help="Data, logs and job dirs "
                                                              "(default: the config's state_dir)",
                                          show_default=False)] = None,
    cloud: Annotated[str | None, Opt("--cloud", help="Also run a cloud provider: 'local' "
                                                     "(machines are worker processes here).",
                                     show_default=False)] = None,
) -> None:
    """Run a whole cluster on this machine; Ctrl-C stops it.

    Redis (embedded unless one is configured), a scheduler, and a worker with a static GPU
    inventory, all as child processes.
    """
    from broker.control.embedded import LocalCluster

    s = settings(ctx)
    configured = s.redis_url or s.config.redis_url
    home = (state_dir or Path(s.config.state_dir)).expanduser().resolve()  # (the hints'
    # paths work from any directory)
    cluster = LocalCluster(home,
                           redis_url=configured, gpus=gpus, cpus=cpus, node_id=node_id,
                           config_path=str(s.config_path) if s.config_path else None,
                           persist=True, port=port, stop_timeout=s.config.grace_s + 15,
                           cloud=cloud)
    install_stop_handlers()
    code = 0
    try:
        with err.status("starting Redis, the scheduler and a worker..."):
            cluster.start()
        where = (f"embedded Redis (data in {cluster.state_dir / 'redis.db'})" if cluster.embedded
                 else "the configured Redis")
        out.print(f"[green]Spillway is up[/] on {where}.")
        out.print(f"  worker     {escape(cluster.node_id)}: {gpus}, {cpus} CPUs")
        out.print(f"  logs       {cluster.log_dir}")
        local = cluster.local_cloud()
        if local is not None:
            out.print(f"  cloud      {escape(local.offer.id)} at "
                      f"${local.offer.price_per_hour:.2f}/h (a local provider: its machines "
                      "are worker processes here)")
        for line in up_hints(cluster, None if local is None else local.offer.id):
            out.print(line)
        while True:
            dead = cluster.dead_child()
            if dead is not None:
                err.print(f"[red]error:[/] {escape(cluster.describe_death(dead))}")
                code = 1
                break
            time.sleep(0.5)
    except (KeyboardInterrupt, _Stop):
        then = ", then the embedded Redis" if cluster.embedded else ""
        err.print(f"stopping the worker and the scheduler{then}...")
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second signal must not cut cleanup
        cluster.stop()
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    raise typer.Exit(code)
