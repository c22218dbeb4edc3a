"""``spillway status``'s data and screen: the cluster at a glance, read from the store
(:func:`status_data`, also its ``--json``), and drawn to fit the terminal
(:func:`status_screen`)."""

import time
from collections import Counter
from typing import Any

from rich.console import Group
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from broker.cli.common import fmt_duration
from broker.cli.render import queued_at

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
