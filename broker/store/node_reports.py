"""Agents' reports, applied by the leading scheduler: agents never write job records.

An agent writes only its own node's keys (broker/security/acl.py): its record, and its reports
appended to its stream ``reports:{node}`` (started, exited, failed to start, preempted on a
drain or a spot notice, and registered when a new incarnation starts). The leading scheduler
reads every node's stream before each cycle (:func:`take`), applies the reports to the job
records under its fencing token with the same compare-and-set rules as before
(:func:`apply`), and deletes them once applied. A report applied twice changes nothing (a
repeated start or exit is a no-op, a stale attempt is refused), so a leader that dies between
applying and deleting loses nothing: the next one applies them again.

A report is believed only for what its node holds: a part's start or end only for the rank
of the attempt placed on that node, a preemption only for a job with a part there. Any other
report (a compromised agent writing about another team's job) is refused and logged.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from broker.errors import Conflict, JobNotFound, StaleAttempt
from broker.model import Instance, InstanceState, Job, Site
from broker.model.state import EvictionKind, JobState
from broker.store.events import Exited, JobEvent, Started, StartFailed
from broker.store.instances import block_key_of

if TYPE_CHECKING:
    from broker.store.base import BaseStore

log = logging.getLogger(__name__)

TAKE = 1000  # reports read from one node's stream at a time


@dataclass(frozen=True)
class Preempted:
    """The agent stops its part and asks that the job be requeued (a drain, a spot notice)."""

    kind: str  # an EvictionKind value
    reason: str


@dataclass(frozen=True)
class Noticed:
    """A spot interruption notice reached the node (its drain follows): the scheduler marks
    the node's instance DRAINING and cools its offer's zone down."""

    reason: str


@dataclass(frozen=True)
class Registered:
    """A new incarnation of the node's agent: the jobs of earlier ones died with them."""

    incarnation: str


NodeEvent = JobEvent | Preempted | Registered | Noticed
DEFAULT_COOLDOWN_S = 900.0  # a provider's cooldown_s when the configuration has none


@dataclass(frozen=True)
class Report:
    job_id: str  # "" for Registered
    attempt: int
    event: NodeEvent
    time: float


_KINDS: dict[str, type[Any]] = {"started": Started, "exited": Exited,
                                "start_failed": StartFailed, "preempted": Preempted,
                                "registered": Registered, "noticed": Noticed}
_NAMES = {cls: name for name, cls in _KINDS.items()}


def encode(report: Report) -> dict[str, str]:
    """The stream entry of a report."""
    body = {k: v for k, v in report.event.__dict__.items()}
    return {"k": _NAMES[type(report.event)], "j": report.job_id, "a": str(report.attempt),
            "t": repr(float(report.time)), "e": json.dumps(body, separators=(",", ":"))}


def decode(fields: Mapping[Any, Any]) -> Report | None:
    """A report from a stream entry; None for an entry that is not one (logged by the
    caller, then dropped)."""
    f = {(k.decode() if isinstance(k, bytes) else str(k)):
         (v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v))
         for k, v in fields.items()}
    try:
        cls = _KINDS[f["k"]]
        event = cls(**json.loads(f["e"]))
        return Report(f.get("j", ""), int(f.get("a", "0")), event, float(f["t"]))
    except (KeyError, TypeError, ValueError):
        return None


@dataclass
class Outcome:
    """What applying one node's reports did."""

    applied: int = 0
    refused: list[str] = field(default_factory=list)  # why each refused report was
    stop: list[Job] = field(default_factory=list)  # jobs whose other nodes must stop their
    # parts (a gang part failed, a part was preempted)
    lost: list[Job] = field(default_factory=list)  # jobs requeued by a new incarnation
    ended: bool = False  # some attempt ended: a cycle has GPUs to give


def apply(store: BaseStore, node_id: str, reports: Sequence[Report], now: float) -> Outcome:
    """Apply node ``node_id``'s reports, in order, to the store (the leader's fencing token
    held by the caller). Only a failing store raises."""
    out = Outcome()
    todo: list[Report] = []
    for r in reports:
        if isinstance(r.event, (Registered, Noticed)):
            if todo:  # (reports of the earlier incarnation, first)
                _apply_jobs(store, node_id, todo, out)
                todo = []
            if isinstance(r.event, Registered):
                out.lost += store.adopt_node(node_id, r.event.incarnation, now)
            else:
                mark_instance(store, node_id, r.event.reason, r.time)
            out.applied += 1
        else:
            todo.append(r)
    if todo:
        _apply_jobs(store, node_id, todo, out)
    return out


def _apply_jobs(store: BaseStore, node_id: str, reports: Sequence[Report], out: Outcome
                ) -> None:
    # The node's check reads the copies this process last read or wrote (the snapshot's, as a
    # rule: no read) where they hold the reported attempt placed (a part's node is fixed for
    # its attempt, and the store's write proves the attempt); the others, and any copy the
    # check would refuse a report by, are read afresh
    ids = list(dict.fromkeys(r.job_id for r in reports))
    jobs = {j.id: j for j in store._cached_jobs(ids) if j is not None}
    fresh = {r.job_id for r in reports
             if r.job_id not in jobs or jobs[r.job_id].attempt != r.attempt
             or not jobs[r.job_id].allocations or _refusal(jobs[r.job_id], node_id, r)}
    if fresh:
        jobs.update((j.id, j) for j in store.get_many(sorted(fresh)) if j is not None)
    events: list[tuple[str, int, JobEvent, float]] = []
    for r in reports:
        job = jobs.get(r.job_id)
        why = _refusal(job, node_id, r)
        if why:
            out.refused.append(why)
            log.warning("a report of node %s refused: %s", node_id, why)
            continue
        if isinstance(r.event, Preempted):
            if events:  # (its part's earlier reports first)
                _report(store, node_id, events, out)
                events = []
            _preempt(store, node_id, r, out)
        elif isinstance(r.event, (Started, Exited, StartFailed)):
            events.append((r.job_id, r.attempt, r.event, r.time))
    if events:
        _report(store, node_id, events, out)


def _refusal(job: Job | None, node_id: str, r: Report) -> str:
    """Why node ``node_id`` may not report ``r`` ("" if it may)."""
    if job is None:
        return ""  # (a job that is gone: the store answers JobNotFound, which is dropped)
    if job.attempt > r.attempt:
        return ""  # stale: refused by the store's own rule, quietly
    if job.attempt < r.attempt:
        return f"a report on attempt {r.attempt} of job {job.id}, which is at {job.attempt}"
    if isinstance(r.event, Preempted):
        if node_id not in job.node_ids:
            return f"preempt of job {job.id}, which has no part on this node"
        return ""
    rank = r.event.rank  # type: ignore[union-attr]
    if not any(a.rank == rank and a.node_id == node_id for a in job.allocations):
        return (f"{type(r.event).__name__} of job {job.id} attempt {r.attempt} rank {rank}, "
                "which is not placed on this node")
    return ""


def _report(store: BaseStore, node_id: str, events: list[tuple[str, int, JobEvent, float]],
            out: Outcome) -> None:
    for (job_id, _, event, _), result in zip(events, store.report_many(events)):
        if isinstance(result, StaleAttempt):  # (a node back from a partition, as a rule)
            log.warning("a report of node %s dropped: %s", node_id, result)
            continue
        if isinstance(result, JobNotFound):
            log.info("a report of node %s dropped: %s", node_id, result)
            continue
        if isinstance(result, Exception):
            log.warning("report of %s not applied: %s", job_id, result)
            continue
        out.applied += 1
        if not isinstance(event, Started):
            out.ended = True
        if result.state is JobState.STOPPING and result.stop_target is JobState.FAILED \
                and len(result.node_ids) > 1:
            out.stop.append(result)  # a gang's part failed: the others stop


def _preempt(store: BaseStore, node_id: str, r: Report, out: Outcome) -> None:
    event = r.event
    assert isinstance(event, Preempted)
    try:
        kind = EvictionKind(event.kind)
    except ValueError:
        kind = EvictionKind.PRIORITY
    try:
        job = store.preempt(r.job_id, r.attempt, r.time, event.reason, kind)
    except (StaleAttempt, JobNotFound, Conflict) as e:
        log.info("preemption report of %s dropped: %s", r.job_id, e)
        return
    out.applied += 1
    if any(n != node_id for n in job.node_ids):
        out.stop.append(job)


def mark_instance(store: BaseStore, node_id: str, reason: str, now: float) -> list[Instance]:
    """A spot notice on node ``node_id``: move its instance record to DRAINING and block its
    offer's zone for the provider's ``cooldown_s``. The records changed (none when the node
    has no instance id or the store has no record of it, e.g. a spot machine started by
    hand)."""
    node = next((n for n in store.nodes() if n.id == node_id), None)
    if node is None or not node.instance_id:
        log.info("spot notice on node %s, which has no instance id: no zone cooled down",
                 node_id)
        return []
    mine = [i for i in store.instances(live_only=True) if i.provider_id == node.instance_id]
    if not mine:
        log.info("spot notice: no live instance record for %s; no zone cooled down",
                 node.instance_id)
    cooldown = _cooldown_s(store.config.providers, Site.parse(node.site).provider)
    out = []
    for inst in mine:
        moved = store.move_instance(inst.request_id, InstanceState.DRAINING, now, reason)
        store.block(block_key_of(inst.offer_id), now + cooldown, reason)
        log.info("instance %s (%s) draining; %s cools down for %.0fs", inst.provider_id,
                 inst.request_id, block_key_of(inst.offer_id), cooldown)
        out += [moved] if moved is not None else []
    return out


def _cooldown_s(providers: Mapping[str, Any], provider: str) -> float:
    """The provider's ``cooldown_s`` in the configuration, if it has one."""
    settings = (providers or {}).get(provider)
    value = getattr(settings, "cooldown_s", None)
    if value is None and isinstance(settings, Mapping):
        value = settings.get("cooldown_s")
    return float(value) if isinstance(value, (int, float)) else DEFAULT_COOLDOWN_S
