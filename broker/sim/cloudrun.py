"""The simulator's side of the clouds: launches become instances that boot after their delay,
register as nodes, run jobs, get interrupted and are released when idle.

A launch in a plan starts its instances (broker/sim/cloud.py :class:`Clouds`). At its boot
time an instance's node heartbeats into the store, exactly as an agent on a real instance
would (its site is the offer's, e.g. ``aws:us-east-1:us-east-1a:spot``), and the cycle places
jobs on it as on any node. A spot instance whose zone loses its spot capacity gets the
provider's notice: its node drains, its jobs are stopped with the notice as their grace
(eviction kind ``spot``), checkpoint and go back to the queue; at the end of the notice it is
gone. Nodes are scaled down by production's rule (broker/cloud/lifecycle.py :func:`scale_down`).
Cost runs from the launch to the end.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Protocol

from broker.cloud.lifecycle import NodeUse, Verdict, scale_down
from broker.cycle.plan import Plan, Snapshot
from broker.model import InstanceState, Node, NodeState
from broker.model.state import ACTIVE, LEAVES_MACHINE, EvictionKind, JobState
from broker.sim.cloud import Clouds, CloudSpec, SimInstance
from broker.sim.runs import SimRun

if TYPE_CHECKING:
    from broker.sim.cluster import Cluster
    from broker.sim.types import JobRecord
    from broker.store.memory import MemoryStore

BOOT, NOTICE, GONE, IDLE = 4, 5, 6, 7  # event kinds (after the engine's own)
_LEASE = 1e15


class Host(Protocol):
    """What a :class:`CloudRun` sees of its simulation (broker/sim/engine.py
    :class:`~broker.sim.engine.Simulation`): its store, nodes and clock, and the GPU counts it
    keeps up to date as cloud nodes come, drain and go."""

    store: MemoryStore
    cluster: Cluster
    node_by_id: dict[str, Node]
    records: dict[str, JobRecord]
    stop_delay_s: float
    devices: int  # GPUs on nodes that take jobs
    busy_off: int  # busy GPUs on cloud nodes that take no new job
    cloud_busy: int  # busy GPUs on cloud nodes

    def _push(self, t: float, kind: int, job_id: str, attempt: int = 0) -> None: ...


class CloudRun:
    def __init__(self, sim: Host, spec: CloudSpec, seed: int) -> None:
        self.sim, self.spec = sim, spec
        self.clouds = Clouds(spec, seed)
        self.by_node: dict[str, SimInstance] = {}
        self.live: set[str] = set()  # nodes that take jobs (counted in sim.devices)
        self.jobs_lost = 0  # jobs on an instance when it went away (must stay 0)
        classes = {c.name: c for c in sim.cluster.classes}
        self._sites = {n: (("onprem", "cloud", "spot") if c.spot_allowed else ("onprem", "cloud"))
                       if c.may_burst else ("onprem",) for n, c in classes.items()}

    def sites_of(self, priority: str) -> tuple[str, ...]:
        """A simulated job's ``sites``: the cloud too when its class may burst."""
        return self._sites.get(priority, ("onprem",))

    def dress(self, snap: Snapshot, now: float) -> Snapshot:
        """The snapshot with the offers and the instances of the run."""
        return replace(snap, offers=self.clouds.offers(now), instances=self.clouds.records())

    def carry_out(self, plan: Plan, now: float) -> None:
        for launch in plan.launches:
            for inst in self.clouds.launch(launch, now):
                self.sim._push(inst.ready_at, BOOT, inst.record.id)
        moving = {p.job_id for p in plan.preemptions if p.kind in LEAVES_MACHINE}
        for job_id in sorted(moving):  # their rented machines drain at once
            for nid in self.sim.store.get(job_id).node_ids:
                held = self.by_node.get(nid)
                if held is not None and nid in self.live and {
                        v.split(":")[0] for v in self.sim.store.allocations([nid])
                        .get(nid, {}).values()} <= moving:
                    self._scale_down(held, now, leaving=True)
        for term in plan.terminations:
            for pid in term.instance_ids:
                held = self.clouds.instances.get(pid)
                if held is not None and held.busy == 0:
                    self._release(held, now, term.reason)

    # -- events ---------------------------------------------------------------------------

    def event(self, kind: int, pid: str, now: float) -> bool:
        """Handle one cloud event; True when a cycle should run now."""
        inst = self.clouds.instances.get(pid)
        if inst is None or inst.record.ended:
            return False
        if kind == BOOT:
            return self._boot(pid, now)
        if kind == NOTICE:
            return self._notice(inst, now)
        if kind == GONE:
            self._release(inst, now, "spot interruption: the provider took it back")
            return True
        if kind == IDLE and inst.node is not None:
            self._scale_down(inst, now)
        return False

    def _scale_down(self, inst: SimInstance, now: float, leaving: bool = False) -> None:
        """Judge a node by production's scale-down rule (broker/cloud/lifecycle.py
        :func:`scale_down`): drain one idle, under half busy, or no longer serving a job it was
        launched for, for the idle timeout, or whose jobs all move to spot (``leaving``);
        release a drained one once its jobs have left."""
        node = inst.node
        assert node is not None
        gpus = len(node.allocatable)
        use = NodeUse(gpus, inst.busy, inst.idle_since,
                      inst.low_since if 2 * inst.busy < gpus else None, inst.ready_at,
                      bool(inst.for_jobs), node.id not in self.live, leaving=leaving)
        verdict, why = scale_down(now, use, self.spec.idle_timeout_s, lambda: self._serves(inst))
        if verdict is Verdict.RELEASE:
            self._release(inst, now, why)
        elif verdict is Verdict.DRAIN:
            self.sim.store.set_node_state(node.id, NodeState.DRAINING, by="scale-down")
            self._unlive(node.id)
            inst.record = inst.record.moved(InstanceState.DRAINING, now, why)
            if inst.busy == 0:
                self._release(inst, now, "released: drained and idle")

    def _serves(self, inst: SimInstance) -> bool:
        """Is a job it was launched for still waiting, or running on it?"""
        node_id = inst.record.node_id
        for job_id in inst.for_jobs:
            job = self.sim.store.get(job_id)
            if job.state is JobState.PENDING or (job.state in ACTIVE
                                                 and node_id in job.node_ids):
                return True
        return False

    def _boot(self, pid: str, now: float) -> bool:
        inst = self.clouds.boot(pid, now)
        if inst is None or inst.node is None:
            return False
        node = inst.node
        self.sim.store.heartbeat(node, _LEASE, now)
        self.sim.node_by_id[node.id] = node
        self.by_node[node.id] = inst
        self.live.add(node.id)
        self.sim.devices += len(node.allocatable)
        self.sim._push(now + self.spec.idle_timeout_s, IDLE, pid)
        down = self.clouds.next_interruption(inst, now)
        if math.isfinite(down):
            self.sim._push(max(now, down), NOTICE, pid)
        return True

    def _notice(self, inst: SimInstance, now: float) -> bool:
        """The provider's interruption notice: drain, stop its jobs (they checkpoint)."""
        node = inst.node
        if node is None or inst.record.state not in (InstanceState.READY,
                                                      InstanceState.DRAINING):
            return False
        self.clouds.interruptions += 1
        notice = inst.site.notice_s
        store = self.sim.store
        store.set_node_state(node.id, NodeState.DRAINING, by="spot")
        self._unlive(node.id)
        if inst.record.state is InstanceState.READY:
            inst.record = inst.record.moved(InstanceState.DRAINING, now,
                                            "spot interruption notice")
        holders = {v.split(":")[0] for v in store.allocations([node.id]).get(node.id, {}).values()}
        grace = min(self.sim.stop_delay_s, max(1.0, notice / 2))
        for job_id in sorted(holders):
            job = store.get(job_id)
            if job.state is not JobState.RUNNING:
                continue
            store.preempt(job_id, job.attempt, now, f"spot interruption of {inst.record.id}",
                          EvictionKind.SPOT)
            self.sim._push(now + grace, 2, job_id, job.attempt)  # the engine's STOP
        self.sim._push(now + notice, GONE, inst.record.id)
        return True

    def _release(self, inst: SimInstance, now: float, reason: str) -> None:
        node = inst.node
        self.clouds.end(inst, now, reason)
        if node is not None:
            self._unlive(node.id)
            self.sim.store.heartbeat(node, 0.0, now)
            lost = self.sim.store.expire(now)
            self.jobs_lost += len(lost)
            # given back, it never returns: off the store's node list, as the provisioner
            # does (two months would otherwise keep tens of thousands of DOWN nodes, read by
            # every snapshot and every lease check)
            self.sim.store.forget_node(node.id)

    def _unlive(self, node_id: str) -> None:
        """The node takes no new job: its GPUs leave ``sim.devices``, and those its jobs
        still hold are counted in ``sim.busy_off`` until they leave (the engine compares the
        busy GPUs of the nodes that take jobs with their devices)."""
        if node_id in self.live:
            self.live.discard(node_id)
            self.sim.devices -= len(self.sim.node_by_id[node_id].allocatable)
            self.sim.busy_off += self.by_node[node_id].busy

    # -- jobs on cloud nodes --------------------------------------------------------------

    def moved(self, run: SimRun, sign: int, now: float) -> None:
        """A job started (+1) on or left (-1) its nodes; idle nodes get a release check."""
        per = run.gpus // max(1, len(run.nodes))
        for nid in run.nodes:
            inst = self.by_node.get(nid)
            if inst is None:
                continue
            self.sim.cloud_busy += sign * per
            if nid not in self.live:
                self.sim.busy_off += sign * per
            self.clouds.job_moved(inst, sign * per, now)
            if sign < 0 and not inst.record.ended and inst.node is not None:
                if inst.busy < 0.5 * len(inst.node.allocatable):
                    inst.low_since = now if inst.low_since is None else inst.low_since
                draining = inst.node.id not in self.live
                self.sim._push(now if draining else now + self.spec.idle_timeout_s, IDLE,
                               inst.record.id)
            elif inst.node is not None and inst.busy >= 0.5 * len(inst.node.allocatable):
                inst.low_since = None

    def metrics(self, horizon: float) -> dict[str, Any]:
        for inst in self.clouds.instances.values():  # close the books at the horizon
            if not inst.record.ended and inst.record.state is not InstanceState.REQUESTED:
                self.clouds.job_moved(inst, 0, horizon)
        out = self.clouds.metrics(horizon)
        out["jobs_lost"] = self.jobs_lost
        out["spot_moves"] = sum(1 for j in self.sim.store.list_jobs() for h in j.history
                                if h.kind is EvictionKind.SPOT_MOVE)
        out["home_moves"] = sum(1 for j in self.sim.store.list_jobs() for h in j.history
                                if h.kind is EvictionKind.HOME)
        out["sla_attainment_may_burst"] = self._attainment(horizon)
        out["deadline_misses"] = sum(
            1 for j in self.sim.store.list_jobs() if j.spec.deadline is not None
            and (j.finished_at is None or j.finished_at > j.spec.deadline))
        return out

    def _attainment(self, horizon: float) -> float | None:
        """SLA attainment over the classes that may burst (broker/sim/metrics.py's rule:
        a job that never started counts as a miss once it has waited past its SLA)."""
        may = {c.name for c in self.sim.cluster.classes if c.may_burst}
        hit = n = 0
        for r in self.sim.records.values():
            if r.infeasible or r.priority not in may:
                continue
            if r.first_start_s is None:
                n += horizon - r.submit_s > r.sla_s
                continue
            n += 1
            hit += r.first_start_s - r.submit_s <= r.sla_s
        return round(hit / n, 4) if n else None
