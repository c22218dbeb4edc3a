"""Rich tables and panels for jobs, explanations and nodes."""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import datetime, timezone
from typing import TYPE_CHECKING

from rich.console import Group
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from broker.cli.common import fmt_duration
from broker.model.state import TERMINAL, JobState
from broker.security.redact import masked_env

if TYPE_CHECKING:
    from broker.client import Explanation, NodeView
    from broker.model import BurstOutlook, Job, JobSpec

STATE_STYLE = {
    JobState.PENDING: "yellow",
    JobState.STARTING: "cyan",
    JobState.RUNNING: "bold cyan",
    JobState.STOPPING: "magenta",
    JobState.SUCCEEDED: "green",
    JobState.FAILED: "bold red",
    JobState.CANCELLED: "dim",
    JobState.PREEMPTED: "magenta",
    JobState.LOST: "red",
}


def state_text(state: JobState) -> Text:
    return Text(state.value, style=STATE_STYLE.get(state, ""))


def gpus_text(spec: JobSpec) -> str:
    text = str(spec.gpus)
    if spec.mig_profile:
        text += f" mig {spec.mig_profile}"
    if spec.gpu_types:
        text += " " + "/".join(spec.gpu_types)
    if spec.nodes > 1:
        text += f" x{spec.nodes}"
    return text


def queued_at(job: Job) -> float:
    return next((h.time for h in reversed(job.history) if h.state is JobState.PENDING),
                job.submitted_at)


def waited_ran(job: Job, now: float) -> str:
    if job.state is JobState.PENDING:
        return f"waited {fmt_duration(now - queued_at(job))}"
    if job.started_at is not None:
        end = job.finished_at if job.state in TERMINAL and job.finished_at else now
        return f"ran {fmt_duration(end - job.started_at)}"
    end = job.finished_at or now
    return f"waited {fmt_duration(end - queued_at(job))}"


def reason_text(job: Job) -> str:
    if job.state is JobState.PENDING:
        r = job.pending_reason
        return f"{r.code}: {r.message}" if r else "not scheduled yet"
    if job.state in (JobState.STARTING, JobState.RUNNING):
        return "on " + ", ".join(job.node_ids)
    last = job.history[-1].reason if job.history else ""
    if job.state is JobState.FAILED and job.exit_code is not None and "exit" not in last:
        return f"{last} (exit {job.exit_code})"
    return last


def fit_widths(natural: Sequence[int], mins: dict[int, int], width: int | None,
               gap: int, last: int | None = None) -> list[int] | None:
    """Column widths that fit ``width`` with ``gap`` columns between columns: the free-text
    columns in ``mins`` give up width, the widest first, down to their minimum (column
    ``last`` only once the others are at theirs); the others (ids, states, numbers) keep their
    natural width. None for ``width``: natural widths. None where even the minimums do not
    fit."""
    widths = list(natural)
    if width is None:
        return widths
    room = width - gap * (len(widths) - 1) - sum(
        w for i, w in enumerate(widths) if i not in mins)
    while sum(widths[i] for i in mins) > room:
        over = [i for i in mins if widths[i] > mins[i]]
        over = [i for i in over if i != last] or over
        if not over:
            return None
        top = max(widths[i] for i in over)
        for i in over:
            if widths[i] == top:
                widths[i] -= 1
    return widths


def fitted_table(heads: Sequence[str], rows: Sequence[Sequence[str]], width: int | None,
                 shorten: dict[int, int], wrap: int | None = None,
                 droppable: Sequence[int] = (), title: str | None = None,
                 ) -> tuple[Table, list[int]]:
    """A borderless table whose lines fit ``width`` (None: natural widths, one line a row).
    The columns in ``shorten`` (index: least width) are cut with an ellipsis and the ``wrap``
    column wraps at words, to make room; the others are never cut. Where even that does not
    fit, the gap between columns narrows to one, and then the ``droppable`` columns go, in
    that order. Returns the table and the indexes of the columns it shows (fill it with
    ``add_row`` in that order)."""
    natural = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(heads)]
    mins = {i: min(natural[i], least) for i, least in shorten.items()}
    keep = list(range(len(heads)))
    widths: list[int] | None = None
    gap = 2
    for dropped in range(len(droppable) + 1):
        keep = [i for i in range(len(heads)) if i not in droppable[:dropped]]
        for gap in (2, 1):  # two spaces between columns only while the wrapped one keeps 24
            least = dict(mins)
            if wrap is not None and gap == 2:
                least[wrap] = max(least[wrap], min(natural[wrap], 24))
            fit = fit_widths([natural[i] for i in keep],
                             {k: least[i] for k, i in enumerate(keep) if i in least}, width, gap,
                             last=keep.index(wrap) if wrap in keep else None)
            if fit is not None:
                widths = [0] * len(heads)
                for k, i in enumerate(keep):
                    widths[i] = fit[k]
                break
        if widths is not None:
            break
    if widths is None:  # nothing fits: the least widths, and the lines run long
        widths = [mins.get(i, w) for i, w in enumerate(natural)]
    table = Table(title=title, header_style="bold", box=None, pad_edge=False,
                  padding=(0, 1) if gap == 2 else (0, 1, 0, 0))
    for i in keep:
        if i == wrap:  # wraps at word boundaries (a long word is folded)
            table.add_column(heads[i], width=widths[i], overflow="fold")
        else:  # shortened with an ellipsis, or never cut
            table.add_column(heads[i], width=widths[i], no_wrap=True,
                             overflow="ellipsis" if i in mins else "crop")
    return table, keep


def jobs_table(jobs: Sequence[Job], now: float | None = None, title: str | None = None,
               width: int | None = 120) -> Table:
    """One row per job, fitted to ``width`` (:func:`broker.cli.common.table_width`): the id,
    class, state, GPUs and times keep their full width; NAME and TEAM are shortened and REASON
    wraps to make room. None: every column at its natural width, one line a job (a pipe)."""
    now = time.time() if now is None else now
    heads = ("ID", "NAME", "TEAM", "CLASS", "STATE", "GPUS", "WAITED/RAN", "REASON")
    rows = [(j.id, j.spec.name or "-", j.team, j.priority, j.state.value, gpus_text(j.spec),
             waited_ran(j, now), reason_text(j)) for j in jobs]
    table, keep = fitted_table(heads, rows, width, shorten={1: 6, 2: 6, 7: 12}, wrap=7,
                               droppable=(2, 1), title=title)
    for j, r in zip(jobs, rows):
        cells: list[str | Text] = [escape(r[i]) for i in keep]
        cells[keep.index(4)] = state_text(j.state)
        table.add_row(*cells)
    return table


def _when(ts: float | None) -> str:
    if ts is None:
        return "-"
    return datetime.fromtimestamp(ts, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def job_panel(job: Job) -> Group:
    s = job.spec
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column()
    rows = [
        ("id", job.id), ("name", s.name or "-"), ("state", state_text(job.state)),
        ("team / class", f"{job.team} / {job.priority}"),
        ("command", s.display_command),
        ("resources", f"{gpus_text(s)} GPU(s), {s.cpus:g} CPU(s), {s.memory_gb:g} GB memory"
                      + (f", >= {s.min_gpu_memory_gb:g} GB per GPU" if s.min_gpu_memory_gb
                         else "")),
        ("sites", ", ".join(s.sites)),
        ("time limit", fmt_duration(s.time_limit) if s.time_limit else "-"),
        ("deadline", _when(s.deadline)),
        ("checkpoint dir", s.checkpoint_dir or "-"),
        ("max price", f"${s.max_price_per_hour:g}/h" if s.max_price_per_hour else "-"),
        ("submitted", _when(job.submitted_at)),
        ("attempt", str(job.attempt)),
        ("placement", "; ".join(f"{a.node_id}[{','.join(a.gpu_ids)}]"
                                for a in job.allocations) or "-"),
        ("exit code", "-" if job.exit_code is None else str(job.exit_code)),
        ("reason", reason_text(job)),
    ]
    if s.env:
        rows.insert(5, ("env", " ".join(f"{k}={v}" for k, v in masked_env(s.env).items())))
    for key, value in rows:
        grid.add_row(key, value if isinstance(value, Text) else escape(str(value)))
    return Group(grid, Text(""), history_table(job))


def history_table(job: Job) -> Table:
    table = Table(title="history", title_justify="left", header_style="bold", box=None)
    for col in ("TIME", "STATE", "ATTEMPT", "REASON"):
        table.add_column(col)
    for h in job.history:
        table.add_row(_when(h.time), state_text(h.state), str(h.attempt), escape(h.reason))
    return table


def explanation_panel(e: Explanation) -> Group:
    named = f" ({e.name})" if e.name and e.name != e.job_id else ""  # (an unnamed job's: its id)
    head = Text.assemble((f"{e.job_id}", "bold"), f"{named} is ", state_text(e.state))
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column()
    sla = "none" if e.sla_s == float("inf") else fmt_duration(e.sla_s)
    grid.add_row("class", f"{e.priority} (rank {e.rank}, accepts waiting up to {sla})")
    grid.add_row("team", escape(e.team))
    waited = fmt_duration(e.waited_s)
    if e.sla_breached:
        waited += " [red](longer than its class accepts)[/]"
    grid.add_row("waited", waited)
    if e.state is JobState.PENDING and e.ranked_at is not None:
        age = fmt_duration(max(0.0, time.time() - e.ranked_at))
        place = (f"{e.position} of {e.pending_total} pending" if e.position is not None
                 else f"not ranked yet ({e.pending_total} pending)")
        grid.add_row("queue position", f"{place} (scheduling order, {e.policy} policy, as of "
                                       f"the last cycle {age} ago)")
    grid.add_row("why", f"[bold]{escape(e.reason_code)}[/]: {escape(e.message)}")
    if e.team_usage_gpu_s is not None:
        grid.add_row("team usage", f"{e.team_usage_gpu_s / 3600:.1f} GPU-hours, decayed "
                                   "(what fair share weighs)")
    for label, res in (("reservation", e.reservation), ("blocked by", e.blocked_by)):
        if res:
            grid.add_row(label, f"{res['job_id']}: {res['model']} on "
                                f"{', '.join(res['node_ids'])} from {_when(res['start_at'])}")
    if e.burst is not None:
        for label, text in burst_rows(e.burst, time.time()):
            grid.add_row(label, text)
    if e.placement:
        grid.add_row("placement", "; ".join(f"{a.node_id}[{','.join(a.gpu_ids)}]"
                                            for a in e.placement))
    if e.exit_code is not None:
        grid.add_row("exit code", str(e.exit_code))
    hist = Table(title="recent history", title_justify="left", header_style="bold", box=None)
    for col in ("TIME", "STATE", "REASON"):
        hist.add_column(col)
    for h in e.history:
        hist.add_row(_when(h.time), state_text(h.state), escape(h.reason))
    return Group(head, grid, Text(""), hist)


def burst_rows(b: BurstOutlook, now: float) -> list[tuple[str, str]]:
    """The explain panel's rows of a job that may burst: its on-prem start forecast (none for
    a cloud-only job) and when and where it bursts if it still waits then."""
    def at(ts: float) -> str:
        left = ts - now
        return f"{_when(ts)} ({'in ' + fmt_duration(left) if left > 0 else 'due now'})"

    rows = []
    if not b.cloud_only:
        sla = f"its SLA breaks at {_when(b.sla_at)}"
        rows.append(("on-prem start", "none forecast; " + sla if b.onprem_start is None else
                     f"forecast {at(b.onprem_start)}; " + sla))
    unless = "a rented machine frees up" if b.cloud_only else "it starts on-prem"
    rows.append(("bursts", f"at {at(b.burst_at)} to {escape(b.where)}, "
                           f"${b.price_per_hour:g}/h (boots in ~{fmt_duration(b.boot_s)}), "
                           f"unless {unless} first"))
    return rows


def nodes_table(nodes: Sequence[NodeView], width: int | None = None) -> Table:
    """One row a node; with cloud nodes, their market, price, instance id and age too, fitted
    to ``width`` (None: natural widths, one line a node)."""
    heads = ["NODE", "STATE", "SITE", "GPUS FREE/TOTAL", "CPUS", "JOBS", "HEARTBEAT"]
    rows = []
    for n in nodes:
        gpus = ", ".join(f"{n.gpus_free.get(k, 0)}/{c} {k}" for k, c in n.gpus_total.items())
        rows.append([n.id, n.state, n.site, gpus or "-", f"{n.cpus:g}",
                     ", ".join(n.jobs) if n.jobs else "-", f"{fmt_duration(n.lease_age_s)} ago"])
    cloud = any(n.instance_id for n in nodes)
    if not cloud:
        table = Table(header_style="bold", box=None, pad_edge=False)
        for col in heads:
            table.add_column(col, no_wrap=col != "JOBS")
        for n, r in zip(nodes, rows):
            style = {"READY": "green", "DRAINING": "yellow"}.get(n.state, "red")
            table.add_row(escape(r[0]), Text(n.state, style=style), *r[2:])
        return table
    heads += ["MARKET", "$/H", "INSTANCE", "AGE"]
    for n, r in zip(nodes, rows):
        r += [n.site.rsplit(":", 1)[-1] if n.site != "onprem" else "-",
              "-" if n.price_per_hour is None else f"{n.price_per_hour:.2f}",
              n.instance_id or "-",
              fmt_duration(n.instance_age_s) if n.instance_age_s is not None else "-"]
    table, keep = fitted_table(heads, rows, width, shorten={0: 10, 2: 10, 3: 10, 5: 6, 9: 8},
                               wrap=5, droppable=(4, 6, 7))
    for n, r in zip(nodes, rows):
        cells: list[str | Text] = [escape(r[i]) for i in keep]
        style = {"READY": "green", "DRAINING": "yellow"}.get(n.state, "red")
        cells[keep.index(1)] = Text(n.state, style=style)
        table.add_row(*cells)
    return table
