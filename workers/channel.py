"""What an agent reads and writes of the store: its own node's keys, nothing else.

An agent never writes a job record (``../shared/DESIGN.md``; broker/security/acl.py gives its
Redis user only its node's keys). It reads its node's *view* (``run:{node}``: the documents
of the jobs placed on it, their attempts and their sealed specs, written by the scheduler with
every job write) and its GPU allocations; it writes its node record (the heartbeat), its
reports into its stream ``reports:{node}`` (applied by the leading scheduler:
broker/store/node_reports.py) and its parts' log lines into its own log streams.

Two channels with one interface:

* :class:`RedisChannel`, what ``spillway worker`` uses: reports are appended, and take effect
  when the leading scheduler applies them (within a cycle; the agent asks for one);
* :class:`StoreChannel`, over a store object in the same process (tests, and the single-
  process tools): the same report rules, applied at once.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from broker.model import Job, Node, NodeState
from broker.model.state import ACTIVE
from broker.security import seal
from broker.store import node_reports
from broker.store.base import BaseStore
from broker.store.events import JobEvent
from broker.store.lua import APPEND_LOGS
from broker.store.node_reports import Registered, Report
from broker.store.redis_keys import HELLO, NodeKeys, append_logs

log = logging.getLogger(__name__)


@dataclass
class View:
    """What runs on this node, as the store says: the jobs placed here (by id), why any of
    them must not run (its spec is not the sealed one), and the owners ("job:attempt") of
    this node's GPUs."""

    jobs: dict[str, Job] = field(default_factory=dict)
    refused: dict[str, str] = field(default_factory=dict)
    owners: set[str] = field(default_factory=set)


class NodeChannel(Protocol):
    node_id: str

    def heartbeat(self, node: Node, ttl: float, now: float) -> None:
        """Write the node's record and lease; a new incarnation also reports Registered."""

    def acked(self, incarnation: str) -> bool:
        """Has the scheduler taken this incarnation (it may hold jobs)?"""

    def view(self) -> View: ...

    def report_many(self, reports: Sequence[Report]) -> None:
        """Send reports, in order; raises only when the store cannot take them."""

    def report(self, job_id: str, attempt: int, event: JobEvent, now: float) -> Job | None:
        """One report (the runner's StartFailed); the job after it where known at once."""

    def append_logs(self, job_id: str, attempt: int, lines: Sequence[tuple[str, str]],
                    now: float) -> None:
        """StaleAttempt if the attempt does not run here (its part is then killed)."""


def _node_doc(node: Node) -> str:
    """A node's document as the store keeps it (state, incarnation and lease apart)."""
    return json.dumps(replace(node, state=NodeState.READY, incarnation="",
                              lease_expires=0.0).to_dict(), separators=(",", ":"))


def sticky(old: Node | None, node: Node) -> Node:
    """``node`` as its heartbeat writes it: an operator's drain sticks, even across an agent
    restart; a drain recorded without ``drained_by`` sticks while this agent lives."""
    if old is not None and old.drained_by:
        return replace(node, state=NodeState.DRAINING, drained_by=old.drained_by)
    if old is not None and old.incarnation == node.incarnation and \
            old.state is NodeState.DRAINING and node.state is NodeState.READY:
        return replace(node, state=NodeState.DRAINING)
    return node


class RedisChannel:
    """An agent's own keys in Redis (module docstring); ``client`` logs in as the node's
    agent user."""

    def __init__(self, client: Any, node_id: str, prefix: str = "sw:") -> None:
        self.redis, self.node_id, self.prefix = client, node_id, prefix
        self.keys = NodeKeys(prefix, node_id)
        self._k_node, self._k_view, self._k_alloc = self.keys.node, self.keys.view, \
            self.keys.alloc
        self._k_reports, self._k_hello = self.keys.reports, f"{prefix}{HELLO}"
        self._append = client.register_script(APPEND_LOGS)
        self._registered = ""  # the incarnation this process reported Registered for

    def heartbeat(self, node: Node, ttl: float, now: float) -> None:
        doc, state, incarnation = self.redis.hmget(self._k_node, ["doc", "state",
                                                                  "incarnation"])
        old = None
        if doc is not None:
            old = replace(Node.from_dict(json.loads(doc)),
                          state=NodeState(state.decode()),
                          incarnation=incarnation.decode() if incarnation else "")
        new = sticky(old, node)
        fresh = self._registered != node.incarnation
        pipe = self.redis.pipeline(transaction=fresh)  # (a new incarnation: all or nothing)
        pipe.hset(self._k_node, mapping={
            "doc": _node_doc(new), "state": new.state.value, "incarnation": new.incarnation,
            "lease_expires": repr(float(now + ttl))})
        if fresh:
            pipe.xadd(self._k_reports, node_reports.encode(
                Report("", 0, Registered(node.incarnation), now)))
            pipe.xadd(self._k_hello, {"n": self.node_id}, maxlen=10_000, approximate=True)
        pipe.execute()
        self._registered = node.incarnation

    def acked(self, incarnation: str) -> bool:
        inc, acked = self.redis.hmget(self._k_node, ["incarnation", "acked"])
        return inc is not None and inc == acked == incarnation.encode()

    def view(self) -> View:
        pipe = self.redis.pipeline(transaction=False)
        pipe.hgetall(self._k_view)
        pipe.hgetall(self._k_alloc)
        raw, alloc = pipe.execute()
        fields = {k.decode(): v for k, v in raw.items()}
        jobs = {k: Job.from_dict(json.loads(v)) for k, v in fields.items()
                if not k.startswith(("a:", "s:"))}
        out = View(jobs, owners={o.decode() for o in alloc.values()})
        ordered = list(jobs.values())
        out.refused = seal.judge(ordered, [fields.get(f"s:{j.id}") for j in ordered])
        return out

    def report_many(self, reports: Sequence[Report]) -> None:
        if not reports:
            return
        pipe = self.redis.pipeline(transaction=False)
        for r in reports:
            pipe.xadd(self._k_reports, node_reports.encode(r))
        pipe.execute()

    def report(self, job_id: str, attempt: int, event: JobEvent, now: float) -> Job | None:
        self.report_many([Report(job_id, attempt, event, now)])
        return None

    def append_logs(self, job_id: str, attempt: int, lines: Sequence[tuple[str, str]],
                    now: float) -> None:
        append_logs(self._append, self.prefix, self.node_id, job_id, attempt, lines, now,
                    client=self.redis)


class StoreChannel:
    """A node's side of a store object in this process: the same rules, applied at once
    (``send_stops``: how a job's other nodes are told to stop their parts)."""

    def __init__(self, store: BaseStore, node_id: str,
                 send_stops: Callable[[Sequence[Job]], object] = lambda jobs: None) -> None:
        self.store, self.node_id, self._send_stops = store, node_id, send_stops

    def heartbeat(self, node: Node, ttl: float, now: float) -> None:
        lost = self.store.heartbeat(node, ttl, now)
        if lost:
            log.warning("jobs of this node's previous incarnation requeued: %s",
                        ", ".join(j.id for j in lost))

    def acked(self, incarnation: str) -> bool:
        return True  # (the store's own heartbeat takes the node at once)

    def view(self) -> View:
        owners = set(self.store.allocations([self.node_id]).get(self.node_id, {}).values())
        jobs = [j for j in self.store.list_jobs(states=ACTIVE) if self.node_id in j.node_ids]
        return View({j.id: j for j in jobs}, self.store.spec_problems(jobs), owners)

    def report_many(self, reports: Sequence[Report]) -> None:
        self._apply(reports)

    def report(self, job_id: str, attempt: int, event: JobEvent, now: float) -> Job | None:
        self._apply([Report(job_id, attempt, event, now)])
        return self.store.get_many([job_id])[0]

    def _apply(self, reports: Sequence[Report]) -> None:
        now = max((r.time for r in reports), default=0.0)
        out = node_reports.apply(self.store, self.node_id, reports, now)
        if out.stop:
            self._send_stops(out.stop)

    def append_logs(self, job_id: str, attempt: int, lines: Sequence[tuple[str, str]],
                    now: float) -> None:
        self.store.append_logs(job_id, attempt, lines, now, self.node_id)
