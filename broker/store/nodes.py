"""Nodes in the store: heartbeats and leases, drains, and requeueing the jobs of a dead node
(a part of the store: its functions take the :class:`~broker.store.core.StoreCore` they
work on)."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from broker.errors import Conflict, JobNotFound, NodeBusy, NodeNotFound
from broker.model import Job, Node, NodeState
from broker.model.state import ACTIVE
from broker.store import transitions as T

if TYPE_CHECKING:
    from broker.store.core import StoreCore

_FOREVER = 1e300  # (a lease time past any now)


def heartbeat(store: StoreCore, node: Node, ttl: float, now: float) -> list[Job]:
    """Register or renew a node's lease. A new incarnation (the agent restarted) loses the
    jobs the old one held: their processes died with it. Returns the jobs requeued."""
    old = next((n for n in store._load_nodes() if n.id == node.id), None)
    lost: list[Job] = []
    if old is not None and old.incarnation != node.incarnation and old.state is not \
            NodeState.DOWN:
        store._mark_down(node.id, old.incarnation, _FOREVER)
        lost = _lose_jobs_on(store, node.id, now, "Agent restarted")
    if old is not None and old.drained_by:  # an operator's drain sticks, even across an
        node = replace(node, state=NodeState.DRAINING,  # agent restart or a DOWN spell
                       drained_by=old.drained_by)
    elif old is not None and old.incarnation == node.incarnation and \
            old.state is NodeState.DRAINING and node.state is NodeState.READY:
        node = replace(node, state=NodeState.DRAINING)  # (a drain recorded before
        # drained_by existed: it sticks while this agent lives)
    store._put_node(node, now + ttl)
    store._ack_node(node.id, node.incarnation)  # (written by the store itself: taken at once)
    return lost


def adopt(store: StoreCore, node_id: str, incarnation: str, now: float) -> list[Job]:
    """Take a node's new agent incarnation (its Registered report, broker/store/
    node_reports.py): the jobs its earlier incarnations held are requeued (their processes
    died with them; no job was placed on the new one yet: a node takes jobs only once taken),
    then the node may hold jobs and joins the node list. Returns the jobs requeued; nothing
    when the record is already of a later incarnation, or this one was taken."""
    cur = store._node_acked(node_id)
    if cur is None or cur[0] != incarnation or cur[1] == incarnation:
        return []
    lost = _lose_jobs_on(store, node_id, now, "Agent restarted")
    store._ack_node(node_id, incarnation)
    return lost

def set_node_state(store: StoreCore, node_id: str, state: NodeState, by: str = "operator") -> Node:
    """Drain (DRAINING) or resume (READY) a node, as ``by`` (recorded on a drain, cleared
    on a resume). DOWN is only reached by lease expiry."""
    if state is NodeState.DOWN:
        raise ValueError("a node goes DOWN only when its lease expires; drain it instead")
    node = next((n for n in store._load_nodes() if n.id == node_id), None)
    if node is None:
        raise NodeNotFound(node_id)
    new = replace(node, state=state,
                  drained_by=by if state is NodeState.DRAINING else "")
    if node.state is NodeState.DOWN:  # (it stays DOWN until its agent is back)
        new = replace(new, state=NodeState.DOWN)
    store._put_node(new, node.lease_expires)
    return new

def nodes(store: StoreCore) -> list[Node]:
    return sorted(store._load_nodes(), key=lambda n: n.id)

def forget(store: StoreCore, node_id: str, now: float, force: bool = False) -> list[Job]:
    """Remove a dead node at an operator's word (``spillway nodes --forget``), as Slurm's
    ``scontrol delete nodename``: refused (NodeBusy) while its agent is alive, since a live
    agent would register it again at its next heartbeat, and while jobs are recorded on it
    (the scheduler requeues those once its lease has run out), unless ``force``: then they are
    requeued here, as lost with the node. NodeNotFound for an unknown node. Returns the jobs
    requeued."""
    node = next((n for n in store._load_nodes() if n.id == node_id), None)
    if node is None:
        raise NodeNotFound(node_id)
    if node.lease_expires > now:
        raise NodeBusy(
            f"node {node_id} is alive: its agent's lease runs {node.lease_expires - now:.1f}s "
            "more; stop the agent first (a live agent registers the node again at its next "
            "heartbeat), then forget it once `spillway nodes` shows it DOWN")
    held = [j for j in store._load(store._index("active"))
            if j is not None and node_id in j.node_ids and j.state in ACTIVE]
    lost: list[Job] = []
    if held and not force:
        ids = ", ".join(j.id for j in held)
        raise NodeBusy(
            f"node {node_id} still holds {len(held)} job(s): {ids}; a running scheduler "
            "requeues them once it sees the node dead, or --force requeues them now (each "
            "loses its attempt, as when a node dies)")
    if held:
        lost = _lose_jobs_on(store, node_id, now, f"Node {node_id} forgotten by an operator")
    store._mark_down(node_id, node.incarnation, now)  # (its lease ran out, though maybe no
    # reconciler marked it yet, or the record shows DOWN only as an agent not yet taken)
    if not store._forget_node(node_id, node.incarnation):
        raise Conflict(f"node {node_id} changed while it was being forgotten (did its agent "
                       "come back?); see `spillway nodes` and try again")
    return lost


def expire(store: StoreCore, now: float) -> list[Job]:
    """Mark nodes whose lease ran out DOWN and requeue the jobs they held."""
    requeued: list[Job] = []
    for node in store._load_nodes():
        if node.state is NodeState.DOWN or node.lease_expires > now:
            continue
        if store._mark_down(node.id, node.incarnation, now):
            requeued += _lose_jobs_on(store, node.id, now, f"Node {node.id} lease expired")
    return requeued

def _lose_jobs_on(store: StoreCore, node_id: str, now: float, reason: str) -> list[Job]:
    out = []
    for job in store._load(store._index("active")):
        if job is None or node_id not in job.node_ids or job.state not in ACTIVE:
            continue
        try:
            out.append(store._update(job.id, _lose_if_on, node_id, job.attempt, now, reason,
                                    store.config.max_attempts))
        except (JobNotFound, Conflict):
            continue
    return out

def _lose_if_on(job: Job, node_id: str, attempt: int, now: float, reason: str,
                max_attempts: int) -> T.Change | None:
    if job.attempt != attempt or job.state not in ACTIVE or node_id not in job.node_ids:
        return None
    return T.lose(job, now, reason, max_attempts)
