"""The lifecycle of rented machines: what to do about each, decided from what the store and
the providers say (a pure function of its inputs; :mod:`broker.cloud.provisioner` carries it out).

Every pass compares the instance records (the store) with every machine tagged with this
cluster (each provider's ``instances()``) and the registered nodes, along the InstanceState
table (broker/model/cloud.py):

- REQUESTED whose machine the provider lists (a provisioner died between launch and record;
  the request id in the tags finds it) -> BOOTING with its provider id; not listed
  ``RESEND_AFTER_S`` after the request (its message was lost with a provisioner that died
  before launching) -> the launch is sent again; never listed within ``boot_timeout_s`` ->
  FAILED;
- BOOTING whose agent registered with its instance id -> READY; not registered within
  ``boot_timeout_s`` -> terminate, FAILED, and the zone cools down;
- READY judged by :func:`scale_down`, the one scale-down rule (the simulator's cloud nodes,
  broker/sim/cloudrun.py, are judged by it too): idle (no job holds a GPU on its node), under
  half busy, or no longer serving a job it was launched for, for ``idle_timeout_s`` -> its
  node is drained, DRAINING (it takes no new job; its jobs run on); DRAINING with no job
  left -> terminate, TERMINATED;
- READY or DRAINING whose node's lease expired -> terminate, TERMINATED (its jobs were
  requeued when the lease expired; counted ``lost``);
- a live record whose machine the provider no longer lists -> TERMINATED, unless the record
  moved at or after ``now`` (when the listing began: a launch in another thread may have
  started the machine after the provider was listed), which waits for the next pass;
- a listed machine tagged with this cluster whose request id is unknown to the store, or
  whose record has ended -> terminate (an orphan: counted ``orphans``, the only step that is).

A provider whose listing failed this pass is left alone: nothing of it is judged on no data.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum

from broker.model import Instance, InstanceState, Node, NodeState
from providers.base import CloudMachine

I = InstanceState  # noqa: E741
GONE = frozenset({I.TERMINATED, I.FAILED})  # a machine in these states costs nothing
IDLE_DRAIN = "spillway: idle"  # who drained a node to scale down (Node.drained_by)
RESEND_AFTER_S = 60.0  # longer than a launch's retries take (1 + 2 + 4 + 8 + 16 s)


@dataclass(frozen=True)
class Timeouts:
    boot_timeout_s: float = 600.0
    idle_timeout_s: float = 300.0


@dataclass(frozen=True)
class Step:
    """One thing to do. ``move``: the record's new state (None: no record change);
    ``terminate``: the machine to give back; ``drain``: the node to drain; ``block``: cool
    the record's zone down; ``count``: which counter it adds to."""

    provider: str
    request_id: str = ""
    move: InstanceState | None = None
    reason: str = ""
    provider_id: str = ""
    node_id: str = ""
    terminate: str = ""
    drain: str = ""
    block: bool = False
    resend: bool = False  # send the record's launch again
    count: str = ""


class Verdict(Enum):
    KEEP = "keep"
    DRAIN = "drain"  # it takes no new job; its jobs run on, and it goes once they have left
    RELEASE = "release"  # give the machine back


@dataclass(frozen=True)
class NodeUse:
    """What the scale-down rule knows of a rented machine's node."""

    gpus: int  # GPUs a job can hold there
    busy: int  # GPUs jobs hold there now
    idle_since: float  # since when no job has held a GPU there (read when ``busy`` is 0)
    low_since: float | None  # since when under half busy (None: at least half busy)
    up_since: float  # when it became ready
    for_jobs: bool  # it was launched for jobs (an operator's machine: not)
    draining: bool = False
    leaving: bool = False  # every job on it is stopping to leave it (spot-move, home)


def scale_down(now: float, use: NodeUse, idle_timeout_s: float,
               serves: Callable[[], bool]) -> tuple[Verdict, str]:
    """The one scale-down rule, of production (:func:`decide`) and of the simulator
    (broker/sim/cloudrun.py). A node is drained once, for ``idle_timeout_s``, it has been
    idle, or under half busy (Kubernetes' cluster autoscaler's default
    scale-down-utilization-threshold of 0.5), or no longer serving a job it was launched for
    (``serves()``: one is still pending, or running there): jobs that land on it meanwhile do
    not keep a rented machine up for ever, and draining only stops new placements. A node
    whose jobs all leave it, for spot or for idle on-prem GPUs (policies/burst/spot_move.py,
    burst_home.py), drains at once. A drained
    node goes once its jobs have left. (No pending job keeps an idle node up: one that could
    run there and was not placed within the idle timeout is held back by the scheduler, and
    the machine would wait for it at a rented machine's price.)"""
    if use.draining:
        if use.busy:
            return Verdict.KEEP, ""
        return Verdict.RELEASE, "released: drained and idle"
    t = idle_timeout_s - 1e-6
    if use.leaving:
        return Verdict.DRAIN, "its jobs leave it (for spot or on-prem)"
    if use.busy == 0 and now - use.idle_since >= t:
        why = f"idle for {now - use.idle_since:.0f}s (idle_timeout_s {idle_timeout_s:g})"
    elif use.low_since is not None and 2 * use.busy < use.gpus and now - use.low_since >= t:
        why = f"under half busy for {now - use.low_since:.0f}s"
    elif use.for_jobs and now - use.up_since >= t and not serves():
        why = "its jobs are done"
    else:
        return Verdict.KEEP, ""
    return Verdict.DRAIN, why


@dataclass
class Pass:
    """The steps of one pass, and when each READY node was first seen idle, and under half
    busy (kept across passes by the caller)."""

    steps: list[Step] = field(default_factory=list)
    idle_since: dict[str, float] = field(default_factory=dict)
    low_since: dict[str, float] = field(default_factory=dict)


def decide(now: float, records: Sequence[Instance],
           machines: Mapping[str, Mapping[str, CloudMachine]], nodes: Sequence[Node],
           busy_nodes: Mapping[str, int], timeouts: Mapping[str, Timeouts],
           idle_since: Mapping[str, float], all_request_ids: frozenset[str],
           serves: Callable[[Instance], bool] = lambda rec: True,
           low_since: Mapping[str, float] | None = None,
           leaving: Callable[[str], bool] = lambda node_id: False) -> Pass:
    """The steps for live ``records`` given each provider's machines (providers whose listing
    failed are absent), every registered node, the GPUs jobs hold per node, and every request
    id the store knows (ended ones included). ``serves(record)``: whether a job the machine
    was launched for is still pending or running on it; ``leaving(node id)``: whether every
    job on a busy node is stopping to move to spot (:func:`scale_down`)."""
    out = Pass()
    clocks = (idle_since, low_since or {}, out.idle_since, out.low_since)
    by_instance = {n.instance_id: n for n in nodes if n.instance_id}
    live_ids = {r.request_id for r in records if not r.ended}
    for rec in records:
        listed = machines.get(rec.provider)
        if listed is None or rec.ended:
            continue
        t = timeouts.get(rec.provider, Timeouts())
        by_request = {m.request_id: m for m in listed.values() if m.request_id}
        machine = listed.get(rec.provider_id) if rec.provider_id else \
            by_request.get(rec.request_id)
        node = by_instance.get(rec.provider_id) if rec.provider_id else None
        out.steps += _judge(now, rec, machine, node, busy_nodes, t, clocks,
                            (serves, leaving))
    for provider, listed in machines.items():
        for m in listed.values():
            if m.state in GONE:
                continue
            known = m.request_id in all_request_ids
            if not known or m.request_id not in live_ids:
                why = "its request id is unknown to the store" if not known else \
                    "its record has ended"
                out.steps.append(Step(provider, m.request_id, terminate=m.provider_id,
                                      reason=f"orphan: {why}", count="orphans"))
    return out


def _since(rec: Instance, state: InstanceState) -> float:
    """When the record last entered ``state`` (its request time if it never moved)."""
    for h in reversed(rec.history):
        if h.state is state:
            return h.time
    return rec.requested_at


_Clocks = tuple[Mapping[str, float], Mapping[str, float], dict[str, float], dict[str, float]]
_Asks = tuple[Callable[[Instance], bool], Callable[[str], bool]]


def _judge(now: float, rec: Instance, machine: CloudMachine | None, node: Node | None,
           busy: Mapping[str, int], t: Timeouts, clocks: _Clocks, asks: _Asks) -> list[Step]:
    p, rid = rec.provider, rec.request_id
    if rec.state is I.REQUESTED:
        if machine is not None and machine.state not in GONE:
            return [Step(p, rid, I.BOOTING, f"found by its request id ({machine.native_state})",
                         provider_id=machine.provider_id, count="found")]
        if now - rec.requested_at > t.boot_timeout_s:
            return [Step(p, rid, I.FAILED, f"not launched within {t.boot_timeout_s:g}s",
                         count="failed")]
        if now - rec.requested_at > RESEND_AFTER_S:
            return [Step(p, rid, reason="no machine yet: its launch message was lost",
                         resend=True, count="resent")]
        return []
    if machine is None or machine.state in GONE:
        if rec.history and rec.history[-1].time >= now:
            return []  # moved since the listing began (launched meanwhile): judged next pass
        what = "no longer lists it" if machine is None else \
            f"lists it {machine.native_state or machine.state.value}"
        return [Step(p, rid, I.TERMINATED, f"vanished: the provider {what}",
                     count="vanished")]
    if rec.state is I.BOOTING:
        if node is not None and node.state is not NodeState.DOWN and node.lease_expires > now:
            return [Step(p, rid, I.READY, f"agent registered as node {node.id}",
                         node_id=node.id, count="ready")]
        if now - _since(rec, I.BOOTING) > t.boot_timeout_s:
            return [Step(p, rid, I.FAILED,
                         f"boot timeout: no agent registered within {t.boot_timeout_s:g}s",
                         terminate=rec.provider_id, block=True, count="boot_timeouts")]
        return []
    node_id = rec.node_id or (node.id if node else "")
    if node is None or node.state is NodeState.DOWN or node.lease_expires <= now:
        return [Step(p, rid, I.TERMINATED, f"node {node_id or '?'} lease expired",
                     terminate=rec.provider_id, count="lost")]
    if rec.state is not I.DRAINING and node.state is not NodeState.READY:
        return []  # drained by an operator: theirs to resume
    return _scale(now, rec, node, node_id, busy.get(node_id, 0), t, clocks, asks)


def _scale(now: float, rec: Instance, node: Node, node_id: str, held: int, t: Timeouts,
           clocks: _Clocks, asks: _Asks) -> list[Step]:
    """A READY or DRAINING machine judged by :func:`scale_down`; its clocks kept."""
    p, rid = rec.provider, rec.request_id
    idle_before, low_before, idle_now, low_now = clocks
    serves, leaving = asks
    gpus = len(node.allocatable)
    draining = rec.state is I.DRAINING
    if not draining and held == 0:
        idle_now[node_id] = idle_before.get(node_id, now)
    if not draining and 2 * held < gpus:
        low_now[node_id] = low_before.get(node_id, now)
    use = NodeUse(gpus, held, idle_now.get(node_id, now), low_now.get(node_id),
                  rec.ready_at if rec.ready_at is not None else _since(rec, I.READY),
                  bool(rec.for_jobs), draining,
                  held > 0 and not draining and leaving(node_id))
    verdict, why = scale_down(now, use, t.idle_timeout_s, lambda: serves(rec))
    if verdict is Verdict.RELEASE:
        return [Step(p, rid, I.TERMINATED, why, terminate=rec.provider_id, count="released")]
    if verdict is Verdict.DRAIN:
        return [Step(p, rid, I.DRAINING, why, drain=node_id, count="idle" if held == 0
                     else "scaled down")]
    return []
