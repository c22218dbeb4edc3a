"""The pieces of ``spillway demo`` that run no process: its workload (:data:`WORKLOAD`, and
:data:`CLOUD_WORKLOAD` that overflows into the local cloud), the :class:`Board` that follows
the jobs and draws the live table, the summary, and the prose it prints as it ends."""

import shlex
import statistics
import time
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rich.console import Group
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from broker.cli import demo_cloud
from broker.cli.common import fmt_duration, out
from broker.cli.render import fitted_table, gpus_text, state_text
from broker.model.state import TERMINAL, JobState

if TYPE_CHECKING:
    from broker.model import Job


@dataclass(frozen=True)
class DemoJob:
    """One job of the demo's workload: its class and size, how long it runs, how it should
    end, and in which wave it is submitted."""

    name: str
    team: str
    priority: str
    gpus: int
    seconds: float
    outcome: JobState  # how it should end: SUCCEEDED, FAILED (on purpose) or CANCELLED
    wave: int = 1  # 2: submitted once the first wave holds every on-prem GPU

    def command(self) -> str:
        say = f'echo "{self.name}: CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES"'
        if self.outcome is JobState.FAILED:
            return (f"{say}; echo {shlex.quote(self.name + ': config.yaml not found')} >&2; "
                    "exit 3")
        return f"{say}; sleep {self.seconds:g}; echo {shlex.quote(self.name + ': done')}"


S, F, C = JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED
WORKLOAD = (
    DemoJob("finetune-llama", "nlp", "critical", 2, 3, S),
    DemoJob("train-resnet", "vision", "high", 4, 4, S),
    DemoJob("bad-config", "speech", "normal", 1, 0, F),
    DemoJob("long-sweep", "vision", "low", 2, 60, C),  # cancelled once it runs
    DemoJob("eval-bert", "nlp", "high", 1, 2, S),
    DemoJob("batch-infer", "vision", "normal", 1, 3, S),
    DemoJob("train-vit", "vision", "normal", 4, 3, S),
    DemoJob("eval-whisper", "speech", "low", 1, 2, S),
    DemoJob("distill", "nlp", "normal", 2, 3, S),
    DemoJob("hparam-a", "vision", "low", 1, 2, S),
    DemoJob("embed-corpus", "nlp", "high", 2, 2, S),
    DemoJob("hparam-b", "vision", "low", 1, 2, S),
)


# With the cloud: long jobs fill the 8 on-prem GPUs, then high jobs (SLA 10 s in the demo's
# classes) arrive and burst; the rest run wherever GPUs free up first.
CLOUD_WORKLOAD = (
    DemoJob("train-vit", "vision", "normal", 4, 18, S),
    DemoJob("finetune-llama", "nlp", "critical", 2, 18, S),
    DemoJob("distill", "nlp", "normal", 2, 18, S),
    DemoJob("train-resnet", "vision", "high", 4, 4, S, wave=2),
    DemoJob("embed-corpus", "nlp", "high", 2, 3, S, wave=2),
    DemoJob("eval-bert", "nlp", "high", 1, 3, S, wave=2),
    DemoJob("long-sweep", "vision", "low", 2, 60, C, wave=2),  # cancelled once it runs
    DemoJob("bad-config", "speech", "normal", 1, 0, F, wave=2),
    DemoJob("batch-infer", "vision", "normal", 1, 3, S, wave=2),
    DemoJob("eval-whisper", "speech", "low", 1, 2, S, wave=2),
    DemoJob("hparam-a", "vision", "low", 1, 2, S, wave=2),
    DemoJob("hparam-b", "vision", "low", 1, 2, S, wave=2),
)


def workload(n: int, cloud: bool = False) -> list[DemoJob]:
    base_jobs = CLOUD_WORKLOAD if cloud else WORKLOAD
    jobs = []
    for i in range(n):
        base = base_jobs[i % len(base_jobs)]
        rnd = i // len(base_jobs)
        name = base.name if rnd == 0 else f"{base.name}-{rnd + 1}"
        jobs.append(DemoJob(name, base.team, base.priority, base.gpus, base.seconds,
                            base.outcome, base.wave))
    return jobs


class Board:
    """The demo's view of its jobs: states, last output line, and the one cancel it does."""

    def __init__(self, client: Any, node: str, inventory: str, cloud: bool = False) -> None:
        self.client, self.node, self.inventory = client, node, inventory
        self.plan: dict[str, DemoJob] = {}
        self.jobs: dict[str, Job] = {}
        self.cursor: dict[str, str] = {}
        self.machines = demo_cloud.Machines() if cloud else None
        self.last_line: dict[str, str] = {}
        self.devices: dict[str, str] = {}  # CUDA_VISIBLE_DEVICES, as each job printed it
        self.cancelled: set[str] = set()
        self.t0 = time.time()

    def submit(self, plan: list[DemoJob]) -> None:
        submitted = self.client.submit_many([
            {"command": p.command(), "name": p.name, "team": p.team, "priority": p.priority,
             "gpus": p.gpus, "cpus": 1} for p in plan])
        for job, p in zip(submitted, plan):
            self.plan[job.id], self.jobs[job.id], self.cursor[job.id] = p, job, "0"

    def onprem_full(self, gpus: int) -> bool:
        """Whether jobs hold ``gpus`` GPUs on the on-prem node, or none is left pending."""
        held = sum(len(a.gpu_ids) for j in self.jobs.values() if j.state is JobState.RUNNING
                   for a in j.allocations if a.node_id == self.node)
        return held >= gpus or not any(j.state is JobState.PENDING for j in self.jobs.values())

    def where(self, job: "Job") -> str:
        """onprem, or the rented machine's short name (cloud-N), of its latest placement."""
        allocs = job.allocations or (job.attempts[-1].allocations if job.attempts else ())
        if not allocs:
            return "-"
        node = allocs[0].node_id
        named = self.machines.name_of_node(node) if self.machines is not None else None
        return named or ("onprem" if node == self.node else node)

    def poll(self) -> None:
        if self.machines is not None:
            self.machines.update(self.client.store.instances())
        ids = list(self.plan)
        for job in self.client.store.get_many(ids):
            if job is not None:
                self.jobs[job.id] = job
        for job_id, job in self.jobs.items():
            if job.attempts:
                lines = self.client.store.read_logs(job_id, job.attempt, self.cursor[job_id])
                if lines:
                    self.cursor[job_id] = lines[-1].cursor
                    self.last_line[job_id] = lines[-1].text.rstrip()
                for line in lines:
                    _, found, value = line.text.partition("CUDA_VISIBLE_DEVICES=")
                    if found:
                        self.devices[job_id] = value.strip()
            if (self.plan[job_id].outcome is JobState.CANCELLED and job_id not in self.cancelled
                    and job.state is JobState.RUNNING and job.started_at is not None
                    and time.time() - job.started_at >= 1.0):
                self.client.cancel(job_id)
                self.cancelled.add(job_id)

    @property
    def done(self) -> bool:
        return all(j.state in TERMINAL for j in self.jobs.values())

    @property
    def settled(self) -> bool:
        """Every job ended and every rented machine given back."""
        return self.done and (self.machines is None or self.machines.settled)

    def render(self, width: int = 120) -> Group:
        """The live view, fitted to ``width`` columns: the job id, the numbers, the site and
        the devices are never cut (devices as ranges, 0-3, where lists do not fit); the last
        output line, then the team, then the name are dropped (the name shortened only past
        12 characters) and the note says which went."""
        now = time.time()
        counts = Counter(j.state for j in self.jobs.values())
        head = Text.assemble(
            ("Spillway demo", "bold"), f"  {self.node} {self.inventory}  ",
            f"{fmt_duration(now - self.t0)}  ",
            ", ".join(f"{s.value.lower()} {counts[s]}" for s in JobState if counts[s]))
        heads = ("ID", "NAME", "TEAM", "CLASS", "GPUS", "STATE", "WAIT", "RAN", "SITE",
                 "DEVICES", "LAST OUTPUT")
        rows = [self._row(job_id, job, now, ranges=False) for job_id, job in self.jobs.items()]
        natural = [max(len(h), *(len(r[k]) for r in rows)) for k, h in enumerate(heads)] \
            if rows else [len(h) for h in heads]
        if sum(natural) + 2 * (len(heads) - 1) > width:
            rows = [self._row(job_id, job, now, ranges=True)
                    for job_id, job in self.jobs.items()]
        table, keep = fitted_table(heads, rows, width, shorten={1: 12, 10: 12},
                                   droppable=(10, 2, 1))
        for job, r in zip(self.jobs.values(), rows):
            cells: list[Any] = [escape(r[i]) for i in keep]
            cells[keep.index(5)] = state_text(job.state)
            table.add_row(*cells)
        note = ("SITE: onprem or rented cloud-N; DEVICES: CUDA_VISIBLE_DEVICES, N of "
                "GPU-<node>-N" if self.machines is not None else
                f"DEVICES: CUDA_VISIBLE_DEVICES as each job saw it (GPU-{self.node}-N as N)")
        parts: list[Any] = [head, Text(note, style="dim"), table]
        hidden = [heads[i] for i in (2, 10, 1) if i not in keep]
        if hidden:
            parts.append(Text(f"({', '.join(hidden)}: not shown at {width} columns)",
                              style="dim"))
        if self.machines is not None:
            names = {j.id: j.spec.name or j.id for j in self.jobs.values()}
            parts += [Text(), self.machines.render(now, names, width)]
        return Group(*parts)

    def _row(self, job_id: str, job: "Job", now: float, ranges: bool) -> tuple[str, ...]:
        devices = self._short(job, self.devices.get(job_id, ""))
        return (job.id, job.spec.name or "-", job.team, job.priority, gpus_text(job.spec),
                job.state.value, fmt_duration(_wait_of(job, now)),
                fmt_duration(_run_of(job, now)), self.where(job),
                (as_ranges(devices) if ranges else devices) or "-",
                self.last_line.get(job_id, ""))

    def _short(self, job: "Job", devices: str) -> str:
        """Static GPUs are named GPU-<node>-<index>: show the indices."""
        allocs = job.allocations or (job.attempts[-1].allocations if job.attempts else ())
        prefix = f"GPU-{allocs[0].node_id if allocs else self.node}-"
        ids = [d.strip() for d in devices.split(",") if d.strip()]
        if not ids or not all(d.startswith(prefix) for d in ids):
            return devices
        return ",".join(d.removeprefix(prefix) for d in ids)


def as_ranges(devices: str) -> str:
    """``0,1,2,3,6`` as ``0-3,6``: runs of three or more indices as ranges (other text as
    it is)."""
    parts = devices.split(",")
    if not all(p.isdigit() for p in parts):
        return devices
    out: list[str] = []
    run = [int(parts[0])]
    for n in (int(p) for p in parts[1:]):
        if n == run[-1] + 1:
            run.append(n)
            continue
        out.append(_run_text(run))
        run = [n]
    out.append(_run_text(run))
    return ",".join(out)


def _run_text(run: list[int]) -> str:
    return f"{run[0]}-{run[-1]}" if len(run) >= 3 else ",".join(map(str, run))


def say(text: str, width: int) -> None:
    """Print prose wrapped at words to ``width`` (at most 100) columns, never inside a
    `command` (a command longer than a line gets one of its own)."""
    import textwrap

    nbsp = "\u00a0"
    pieces = text.split("`")
    kept = "`".join(p.replace(" ", nbsp) if k % 2 else p for k, p in enumerate(pieces))
    for para in kept.split("\n"):
        lines = textwrap.wrap(para, min(width, 100), break_long_words=False,
                              break_on_hyphens=False) or [""]
        for line in lines:
            out.print(escape(line.replace(nbsp, " ")), soft_wrap=True)


def _wait_of(job: "Job", now: float) -> float | None:
    if job.attempts:
        return job.attempts[0].started_at - job.submitted_at
    return (job.finished_at or now) - job.submitted_at


def _run_of(job: "Job", now: float) -> float | None:
    if not job.attempts:
        return None
    start = job.attempts[-1].started_at
    end = job.attempts[-1].ended_at or job.finished_at or now
    return end - start


def summary(board: Board, left: int = 0) -> tuple[Table, list[str]]:
    """The summary table and the jobs that ended otherwise than planned; ``left``: cloud
    machines the provider still lists."""
    jobs = list(board.jobs.values())
    counts = Counter(j.state.value for j in jobs)
    waits = [j.attempts[0].started_at - j.submitted_at for j in jobs if j.attempts]
    ends = [j.finished_at for j in jobs if j.finished_at is not None]
    makespan = max(ends) - min(j.submitted_at for j in jobs) if ends else None
    table = Table(title="summary", title_justify="left", show_header=False, box=None)
    table.add_column("")
    table.add_column("", justify="right")
    for state in JobState:
        if counts[state.value]:
            table.add_row(state_text(state), str(counts[state.value]))
    table.add_row("jobs", str(len(jobs)))
    table.add_row("mean wait", fmt_duration(statistics.mean(waits)) if waits else "-")
    table.add_row("max wait", fmt_duration(max(waits)) if waits else "-")
    table.add_row("makespan", fmt_duration(makespan))
    if board.machines is not None:
        on_cloud = sum(board.where(j).startswith("cloud-") for j in jobs)
        table.add_row("jobs run on cloud machines", str(on_cloud))
        started = [j for j in jobs if j.attempts]
        within = sum(j.attempts[0].started_at - j.submitted_at
                     <= demo_cloud.SLA_S.get(j.priority, float("inf")) for j in started)
        table.add_row("jobs started within their SLA", f"{within} of {len(started)}")
        for key, value in demo_cloud.summary_rows(board.machines, left):
            table.add_row(key, value)
    wrong = [f"{j.spec.name} ({j.id}) ended {j.state.value}, expected "
             f"{board.plan[j.id].outcome.value}" for j in jobs
             if j.state is not board.plan[j.id].outcome]
    return table, wrong


def closing_notes(jobs: list["Job"], config: Any, backfill: bool = True) -> list[str]:
    """What the demo says when it ends: why a lower class started before a higher one, if one
    did (backfill; not asked with the cloud, where that has other causes), and what to try
    next."""
    rank = {c.name: c.rank for c in config.classes}
    started = sorted((j for j in jobs if j.attempts), key=lambda j: j.attempts[0].started_at)
    notes = []
    pair = next(((lo, hi) for i, hi in enumerate(started) for lo in started[:i]
                 if rank.get(lo.priority, 0) < rank.get(hi.priority, 0)
                 and hi.submitted_at < lo.attempts[0].started_at < hi.attempts[0].started_at),
                None)
    if pair and backfill:
        lo, hi = pair
        gpus = f"{hi.spec.gpus} GPUs" if hi.spec.gpus != 1 else "a GPU"
        notes.append(f"{lo.name} ({lo.priority}) started before {hi.name} ({hi.priority}): "
                     f"backfill. {hi.name} needed {gpus} free together and fewer were; "
                     f"{lo.name} fitted in the GPUs left idle meanwhile, never delaying the job "
                     f"first in line. `spillway explain JOB` says why a job waits.")
    notes.append("Next: `spillway up` runs this cluster until Ctrl-C (`--cloud local` adds "
                 "the cloud) and prints the `export` lines for another terminal (the Redis "
                 "URL; with the cloud, its configuration file too); there, from your "
                 "project's directory: `spillway submit --gpus 1 -- python train.py`, then "
                 "`spillway queue`, `spillway explain JOB`, `spillway logs -f JOB`.")
    return notes
