"""The lifecycle of rented machines: what to do about each, decided from what the store and
the providers say (a pure function of its inputs; :mod:`broker.provisioner` carries it out).

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
- READY idle (no job holds a GPU on its node) longer than ``idle_timeout_s``, and no pending
  job could run there -> its node is drained, DRAINING; DRAINING with no job left ->
  terminate, TERMINATED, unless a pending job could run there again (drained for idleness
  only) -> its node resumes, READY;
- READY or DRAINING whose node's lease expired -> terminate, TERMINATED (its jobs were
  requeued when the lease expired);
- a live record whose machine the provider no longer lists -> TERMINATED, unless the record
  moved at or after ``now`` (when the listing began: a launch in another thread may have
  started the machine after the provider was listed), which waits for the next pass;
- a listed machine tagged with this cluster whose request id is unknown to the store, or
  whose record has ended -> terminate (an orphan).

A provider whose listing failed this pass is left alone: nothing of it is judged on no data.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from broker.model import Instance, InstanceState, Node, NodeState
from providers.base import CloudMachine

I = InstanceState  # noqa: E741
GONE = frozenset({I.TERMINATED, I.FAILED})  # a machine in these states costs nothing
IDLE_DRAIN = "spillway: idle"  # who drained a node for idleness (Node.drained_by)
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
    resume: str = ""  # the node to take jobs again (it was drained for idleness)
    count: str = ""


@dataclass
class Pass:
    """The steps of one pass, and when each READY node was first seen idle (kept across
    passes by the caller)."""

    steps: list[Step] = field(default_factory=list)
    idle_since: dict[str, float] = field(default_factory=dict)


def decide(now: float, records: Sequence[Instance],
           machines: Mapping[str, Mapping[str, CloudMachine]], nodes: Sequence[Node],
           busy_nodes: frozenset[str], timeouts: Mapping[str, Timeouts],
           idle_since: Mapping[str, float], all_request_ids: frozenset[str],
           wanted: Callable[[Node], bool] = lambda node: False) -> Pass:
    """The steps for live ``records`` given each provider's machines (providers whose listing
    failed are absent), every registered node, the nodes where a job holds GPUs, and every
    request id the store knows (ended ones included). ``wanted(node)``: whether a pending job
    could run on an idle node (asked only of a node about to be released; it is kept)."""
    out = Pass()
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
        out.steps += _judge(now, rec, machine, node, busy_nodes, t, idle_since, out.idle_since,
                            wanted)
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


def _judge(now: float, rec: Instance, machine: CloudMachine | None, node: Node | None,
           busy: frozenset[str], t: Timeouts, idle_before: Mapping[str, float],
           idle_now: dict[str, float], wanted: Callable[[Node], bool]) -> list[Step]:
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
                     terminate=rec.provider_id, count="orphans")]
    if rec.state is I.DRAINING:
        if node_id in busy:
            return []
        if node.drained_by == IDLE_DRAIN and wanted(node):  # demand came back in time
            idle_now[node_id] = now
            return [Step(p, rid, I.READY, "new demand: a pending job could run there",
                         resume=node_id, count="resumed")]
        return [Step(p, rid, I.TERMINATED, "released: drained and idle",
                     terminate=rec.provider_id, count="released")]
    if node_id in busy or node.state is not NodeState.READY:  # READY, in use (or drained
        return []  # by an operator: theirs to resume)
    since = idle_before.get(node_id, now)
    idle_now[node_id] = since
    if now - since > t.idle_timeout_s:
        if wanted(node):  # a pending job could run there: the next cycle places it
            idle_now[node_id] = now
            return []
        return [Step(p, rid, I.DRAINING, f"idle for {now - since:.0f}s "
                     f"(idle_timeout_s {t.idle_timeout_s:g})", drain=node_id,
                     count="idle")]
    return []
