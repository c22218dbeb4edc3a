"""The cloud half of ``spillway demo``: a ``local`` cloud beside the embedded cluster, the demo's
classes and burst settings, the workload that overflows on-prem, and the machines' view.

The demo's classes keep the default names and ranks with demo-sized SLAs (seconds, not
minutes), and its normal class is not preemptible, so a high job that finds on-prem full cannot
make room by preemption: its SLA would break, and the ``spillway`` policy's burst phase
(policies/burst/sla.py) rents a ``local`` machine for it through the provisioner. The machines are
worker processes on this host (providers/local.py), released once idle for a few seconds.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.markup import escape
from rich.table import Table
from rich.text import Text

from broker.cli.common import fmt_duration

if TYPE_CHECKING:
    from broker.model import Instance, Job

CLUSTER = "demo"
PROVIDER = "local"
GPUS = "4xA100-80GB"
PRICE_PER_HOUR = 12.0  # the demo's price: $3 a GPU-hour
BOOT_DELAY_S = 1.5
IDLE_TIMEOUT_S = 3.0
SLA_S = {"critical": 10.0, "high": 10.0, "normal": 600.0, "low": 3600.0}

# The default classes (broker/config/core.py) with demo-sized SLAs; normal is not preemptible here
CLASSES = (
    {"name": "critical", "rank": 400, "sla_s": SLA_S["critical"], "may_preempt": True,
     "preemptible": False, "spot_allowed": False},
    {"name": "high", "rank": 300, "sla_s": SLA_S["high"], "may_preempt": True,
     "preemptible": False},
    {"name": "normal", "rank": 200, "sla_s": SLA_S["normal"], "preemptible": False},
    {"name": "low", "rank": 100, "sla_s": SLA_S["low"], "may_burst": False},
)

# The burst phase's settings (docs/burst.md) sized for machines that boot in seconds
BURST_SETTINGS = {"boot_s": 4.0, "margin_s": 1.0, "late_min_gain_s": 5.0}


def write_config(directory: Path, base: str | None = None) -> Path:
    """The demo's configuration file: the file ``base`` (the user's, if any) with the demo's
    classes, burst settings and a ``local`` cloud provider."""
    import yaml

    data = user_config(base)
    settings = dict(data.get("policy_settings") or {})
    settings["sla"] = {**dict(settings.get("sla") or {}), **BURST_SETTINGS}
    data.update(
        cluster_name=CLUSTER, classes=[dict(c) for c in CLASSES], policy="spillway",
        policy_settings=settings,
        providers={PROVIDER: {
            "kind": "local", "gpus": GPUS, "cpus": 16, "memory_gb": 64,
            "price_per_hour": PRICE_PER_HOUR, "boot_delay_s": BOOT_DELAY_S,
            "idle_timeout_s": IDLE_TIMEOUT_S, "boot_timeout_s": 60, "stop_timeout_s": 5,
            "max_instances": 4, "state_dir": str(directory / "cloud")}},
        state_dir=str(directory / "state"))  # the machines' agents' work dirs too
    path = directory / "demo-config.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def intro() -> str:
    sla = ", ".join(f"{k} {fmt_duration(v)}" for k, v in SLA_S.items())
    return (f"cloud: a local provider renting {GPUS} machines at ${PRICE_PER_HOUR:.2f}/h (worker "
            f"processes here; boot ~{BOOT_DELAY_S:g}s, released after {IDLE_TIMEOUT_S:g}s idle)."
            f"\nDemo classes (SLAs in seconds, normal jobs not preemptible): {sla}. The high "
            "jobs arrive when on-prem is full.")


class Machines:
    """The demo's rented machines, as the store records them, with short names (cloud-1...)."""

    def __init__(self) -> None:
        self.records: dict[str, Instance] = {}
        self.names: dict[str, str] = {}  # request id -> cloud-N

    def update(self, records: Iterable[Instance]) -> None:
        for inst in sorted(records, key=lambda i: (i.requested_at, i.request_id)):
            self.records[inst.request_id] = inst
            self.names.setdefault(inst.request_id, f"cloud-{len(self.names) + 1}")

    def name_of_node(self, node_id: str) -> str | None:
        """cloud-N for a rented machine's node, None for an on-prem one."""
        for rid, inst in self.records.items():
            if node_id and node_id in (inst.node_id, inst.provider_id):
                return self.names[rid]
        return None

    @property
    def settled(self) -> bool:
        """Every machine rented is given back (or none was rented)."""
        return all(i.ended for i in self.records.values())

    def cost(self, now: float) -> float:
        """Dollars: each machine's seconds from its launch to its release x its price."""
        return sum(((i.ended_at or now) - i.requested_at) / 3600.0 * i.price_per_hour
                   for i in self.records.values())

    def counts(self) -> dict[str, int]:
        from broker.model import InstanceState

        states = [i.state for i in self.records.values()]
        return {"launched": len(states),
                "released": states.count(InstanceState.TERMINATED),
                "failed": states.count(InstanceState.FAILED),
                "running": sum(not i.ended for i in self.records.values())}

    def render(self, now: float, job_names: Mapping[str, str], width: int | None = None
               ) -> Table | Text:
        """One row a machine, fitted to ``width``: on one line each where that fits; else
        without the instance id (the machine's short name stays), the jobs it was rented for
        and its last move wrapped at words, never cut."""
        if not self.records:
            return Text("cloud: no machine rented yet", style="dim")
        heads = ("MACHINE", "STATE", "UP", "COST", "INSTANCE", "FOR", "LAST MOVE")
        rows = []
        for rid, i in self.records.items():
            up = (i.ended_at or now) - i.requested_at
            jobs = [job_names.get(j, j) for j in i.for_jobs]
            rows.append((self.names[rid], i.state.value, fmt_duration(up),
                         f"${up / 3600.0 * i.price_per_hour:.3f}", i.id,
                         ",".join(jobs) or "-", i.reason))
        natural = [max(len(h), *(len(r[k]) for r in rows)) for k, h in enumerate(heads)]
        table = Table(title="cloud machines", title_justify="left", header_style="bold",
                      box=None, pad_edge=False)
        if width is None or sum(natural) + 2 * (len(heads) - 1) <= width:
            for h in heads:
                table.add_column(h, no_wrap=True)
            for r in rows:
                table.add_row(*(escape(c) for c in r))
            return table
        for h in heads[:4]:
            table.add_column(h, no_wrap=True)
        table.add_column("FOR", overflow="fold", min_width=12)
        table.add_column("LAST MOVE", overflow="fold", min_width=12)
        for r in rows:
            table.add_row(*(escape(c) for c in r[:4]), escape(r[5].replace(",", ", ")),
                          escape(r[6]))
        return table

    def ran_on(self, job: Job, onprem_node: str) -> list[str]:
        """Where ``job``'s attempts ran, in order, from its records: onprem or cloud-N (a
        node no record names: its id)."""
        places: list[str] = []
        for attempt in job.attempts:
            for alloc in attempt.allocations:
                place = "onprem" if alloc.node_id == onprem_node else \
                    self.name_of_node(alloc.node_id) or alloc.node_id
                if place not in places:
                    places.append(place)
        return places


def summary_rows(machines: Machines, left: int, now: float | None = None) -> list[tuple[str, str]]:
    """The cloud lines of the demo's summary; ``left``: machines the provider still lists."""
    c = machines.counts()
    now = time.time() if now is None else now
    seconds = sum((i.ended_at or now) - i.requested_at for i in machines.records.values())
    return [("cloud machines launched", str(c["launched"])),
            ("cloud machines released", str(c["released"] + c["failed"])),
            ("cloud machine-seconds", f"{seconds:.1f}"),
            ("cloud cost", f"${machines.cost(now):.4f} (machine-seconds x "
                           f"${PRICE_PER_HOUR:.2f}/h)"),
            ("cloud machines left running", str(max(c["running"], left)))]


def notes(machines: Machines, jobs: Iterable[Job], onprem_node: str) -> list[str]:
    """What the demo says about the cloud when it ends: why the first machine was rented,
    where each job a machine was rented for actually ran (from the jobs' and the machines'
    records: a machine may boot after on-prem GPUs free up, and its job runs there instead),
    what else ran on them, and how they went away."""
    if not machines.records:
        return ["No cloud machine was rented: on-prem started every job within its SLA."]
    by_id = {j.id: j for j in jobs}
    ordered = sorted(machines.records.values(), key=lambda i: (i.requested_at, i.request_id))
    first = ordered[0]
    name = machines.names[first.request_id]
    said = []
    launched = [by_id[j] for j in first.for_jobs if j in by_id]
    if launched:
        job = launched[0]
        ran = machines.ran_on(job, onprem_node)
        where = ("and it ran there" if ran == [name] else
                 f"but it ran on {' then '.join(ran)} instead" if ran
                 else "but it never started")
        said.append(f"{job.spec.name} ({job.priority}, SLA {fmt_duration(SLA_S.get(job.priority))}"
                    f") found on-prem full until its long jobs ended: its SLA would break, so "
                    f"the burst phase rented {name} for it ({escape(first.offer_id)}, "
                    f"${first.price_per_hour:.2f}/h) through the provisioner, {where}.")
    rented_for = []
    for inst in ordered:
        mine = [by_id[j] for j in inst.for_jobs if j in by_id]
        if mine:
            rented_for.append(f"{machines.names[inst.request_id]} for " + ", ".join(
                f"{j.spec.name or j.id} (ran on "
                f"{' then '.join(machines.ran_on(j, onprem_node)) or 'nothing'})"
                for j in mine))
    if rented_for:
        said.append("Rented: " + "; ".join(rented_for) + ".")
    burst = {j for inst in ordered for j in inst.for_jobs}
    others = sum(1 for j in by_id.values() if j.id not in burst and any(
        p.startswith("cloud-") for p in machines.ran_on(j, onprem_node)))
    if others:
        said.append(f"Once up, a rented machine is a node like any other: {others} more "
                    "job(s) that fitted ran there too, low ones included (a low job may not "
                    "rent a machine, but may use one).")
    said.append(f"Each machine idle for {IDLE_TIMEOUT_S:g}s was drained and given back "
                "(under `spillway up --cloud local`, `spillway instances --all` lists every launch "
                "and release with its reasons).")
    return [" ".join(said)]


def machines_left(cluster: Any) -> int:
    """Live machines the local cloud still lists (0 without one)."""
    from broker.cloud.lifecycle import GONE

    provider = cluster.local_cloud()
    if provider is None:
        return 0
    return sum(m.state not in GONE for m in provider.instances().values())


def user_config(path: str | None) -> dict[str, Any]:
    if not path:
        return {}
    import yaml

    data = yaml.safe_load(Path(path).expanduser().read_text()) or {}
    return dict(data) if isinstance(data, dict) else {}
