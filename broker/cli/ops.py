"""Operator commands: status, nodes, drain, resume, scheduler, worker, up."""

import signal
import time
from collections import Counter
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Group
from rich.markup import escape
from rich.table import Table
from rich.text import Text

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
from broker.cli.render import nodes_table, queued_at
from broker.cli.root import app

Opt = typer.Option
FAILED_WINDOW_S = 600.0  # status counts the cycles that failed this long back


def status_data(client: Any) -> dict[str, Any]:
    """The cluster at a glance, from the store: leader, nodes, queue by class, active jobs and
    live cloud instances by state."""
    from broker.cycle.plan import POLICY_ERROR

    now = time.time()
    store = client.store
    leader = store.leader(now)
    drained = {n.id: n.drained_by for n in store.nodes()}
    snap = store.snapshot(now)
    queue = {c.name: {"class": c.name, "pending": 0, "oldest_wait_s": 0.0, "sla_s": c.sla_s}
             for c in client.config.classes}
    for job in snap.pending:
        row = queue.setdefault(job.priority, {"class": job.priority, "pending": 0,
                                              "oldest_wait_s": 0.0, "sla_s": None})
        row["pending"] += 1
        row["oldest_wait_s"] = round(max(row["oldest_wait_s"], now - queued_at(job)), 3)
    active = {s: sum(j.state.value == s for j in snap.active)
              for s in ("STARTING", "RUNNING", "STOPPING")}
    failed = store.cycle_failures(since=now - FAILED_WINDOW_S)
    aside = [{"job": job_id, "message": r.message}
             for job_id, r in store.reasons([j.id for j in snap.pending]).items()
             if r.code == POLICY_ERROR]
    return {
        "at": now,
        "leader": None if leader is None else {"token": leader[0],
                                               "lease_left_s": round(leader[1], 3)},
        "nodes": [{"id": v.id, "state": v.state, "site": v.site, "gpus_free": v.free,
                   "gpus_total": v.total, "drained_by": drained.get(v.id, ""),
                   "isolation": v.isolation}
                  for v in client.nodes()],
        "queue": list(queue.values()),
        "running": active["RUNNING"],
        "active": active,
        "instances": [{"state": st, "count": n} for st, n in sorted(Counter(
            i.state.value for i in store.instances(live_only=True)).items())],
        # scheduling cycles that failed lately, and jobs a policy failed on (set aside)
        "cycles": {"window_s": FAILED_WINDOW_S, "failed": len(failed),
                   "last_failure": None if not failed else {
                       "at": failed[0][0], "ago_s": round(max(0.0, now - failed[0][0]), 3),
                       "error": failed[0][1]}},
        "set_aside": aside,
    }


def status_screen(data: dict[str, Any], width: int | None = None) -> Group:
    """The screen of ``spillway status``, ``width`` columns wide (None: any). Where the nodes'
    table would not fit, who drained each node and how its jobs are kept apart go to a line
    under it: a node's id, state, site and GPUs are never cut."""
    lead = data["leader"]
    parts: list[Any] = [
        Text.assemble(("Leader     ", "bold"),
                      (f"{lead['token']}, lease {lead['lease_left_s']:.1f}s left", "green")
                      if lead else ("none: no scheduler leads (start `spillway scheduler`)",
                                    "red"))]
    rows = [(n["id"], n["state"], n["site"], f"{n['gpus_free']}/{n['gpus_total']}",
             n["drained_by"] or "-", n.get("isolation") or "-") for n in data["nodes"]]
    heads = ("NODE", "STATE", "SITE", "GPUS FREE/TOTAL", "DRAINED BY", "JOBS ISOLATED")
    need = sum(max([len(h), *(len(r[i]) for r in rows)]) for i, h in enumerate(heads))
    wide = width is None or need + 2 * (len(heads) - 1) <= width
    nodes = Table(header_style="bold", box=None, pad_edge=False, title_justify="left",
                  title=f"Nodes ({len(data['nodes'])})", title_style="bold")
    for col in heads if wide else heads[:4]:
        nodes.add_column(col, no_wrap=True)
    below: list[Text] = []
    for node_id, state, site, gpus, drained, iso in rows:
        style = {"READY": "green", "DRAINING": "yellow"}.get(state, "red")
        cells: list[Any] = [escape(node_id), Text(state, style=style), escape(site), gpus]
        iso_text = Text(iso, style="" if iso in ("uid per team", "-") else "yellow")
        if wide:
            cells += [escape(drained), iso_text]
        else:
            below.append(Text.assemble(f"  {node_id}: ", *(
                [f"drained by {drained}; "] if drained != "-" else []), "jobs isolated: ",
                iso_text))
        nodes.add_row(*cells)
    queue = Table(header_style="bold", box=None, pad_edge=False, title_justify="left",
                  title="Queue", title_style="bold")
    for col in ("CLASS", "PENDING", "OLDEST WAIT", "SLA"):
        queue.add_column(col, no_wrap=True)
    for q in data["queue"]:
        late = q["sla_s"] is not None and q["oldest_wait_s"] > q["sla_s"]
        queue.add_row(escape(q["class"]), str(q["pending"]),
                      Text(fmt_duration(q["oldest_wait_s"]) if q["pending"] else "-",
                           style="red" if late else ""),
                      fmt_duration(q["sla_s"]) if q["sla_s"] is not None else "-")
    a = data["active"]
    parts += [*([nodes, *below] if data["nodes"] else [Text("Nodes      none registered")]),
              queue,
              Text.assemble(("Running    ", "bold"), f"{data['running']} job(s) "
                            f"({a['STARTING']} starting, {a['STOPPING']} stopping)"),
              Text.assemble(("Cloud      ", "bold"), ", ".join(
                  f"{i['count']} {i['state']}" for i in data["instances"]) or "none"),
              *_health_lines(data)]
    return Group(*parts)


def _health_lines(data: dict[str, Any]) -> list[Text]:
    """Failed cycles lately and jobs set aside: what to look at when nothing is scheduled."""
    cycles, aside = data["cycles"], data["set_aside"]
    last = cycles["last_failure"]
    window = fmt_duration(cycles["window_s"])
    lines = [Text.assemble(("Cycles     ", "bold"), (
        f"{cycles['failed']} failed in the last {window}, the last {fmt_duration(last['ago_s'])}"
        f" ago: {last['error']} (the scheduler's log has the traceback)", "red")
        if last else (f"none failed in the last {window}", "green"))]
    if aside:
        ids = ", ".join(a["job"] for a in aside[:10]) + (", ..." if len(aside) > 10 else "")
        lines.append(Text.assemble(("Set aside  ", "bold"), (
            f"{len(aside)} job(s) a policy failed on: {ids} (`spillway explain JOB` says "
            "which policy and why)", "yellow")))
    else:
        lines.append(Text.assemble(("Set aside  ", "bold"), "none"))
    return lines


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
        from workers.agent import run_agent
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
