"""The Python client: what researchers use, and what the CLI is built on.

    from broker.client import Client
    with Client() as c:                       # URL from SPILLWAY_REDIS_URL or the config file
        job = c.submit(command="python train.py", gpus=4, gpu_types=["A100"], priority="high")
        c.wait(job.id, timeout=3600)
        for line in c.logs(job.id):
            print(line.text)

Every method returns frozen, typed values (:class:`Job`, :class:`Explanation`,
:class:`NodeView`). Bad input raises :class:`~broker.errors.SpecError` naming each field, and
nothing is stored.
"""

from __future__ import annotations

import builtins
import copy
import math
import os
import time
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from broker.bus.runtime import Runtime
from broker.config.core import Config, load_config
from broker.errors import ConfigError, FieldError, SpecError, SpillwayError
from broker.model import (
    Allocation,
    BurstOutlook,
    HistoryEntry,
    Job,
    JobSpec,
    Node,
    NodeState,
    Reason,
)
from broker.model.cloud import Offer
from broker.model.state import TERMINAL, JobState
from broker.store.backend import LogLine, QueueOrder
from broker.store.base import BaseStore
from broker.store.reach import guarded, url_from_file

if TYPE_CHECKING:  # (Celery and Redis's client are imported when first used: `spillway
    import redis  # queue` needs neither Celery nor the submit-time checks)
    from celery import Celery

__all__ = ["Client", "Explanation", "JobTimeout", "NodeView"]

StateFilter = str | JobState | Iterable[str | JobState] | None


class JobTimeout(SpillwayError, TimeoutError):
    """``wait`` gave up before the job ended. ``job`` is its last seen record."""

    def __init__(self, job: Job, timeout: float) -> None:
        self.job = job
        super().__init__(
            f"job {job.id} is still {job.state.value} after {timeout:g}s; "
            f"`spillway explain {job.id}` says why"
        )


@dataclass(frozen=True)
class Explanation:
    """Why a job is where it is: the answer to "why is my job still pending?"."""

    job_id: str
    name: str
    state: JobState
    team: str
    priority: str
    rank: int
    sla_s: float
    attempt: int
    waited_s: float  # time queued in the current attempt (until it started, or until now)
    sla_breached: bool  # pending longer than its class accepts
    reason_code: str
    message: str
    # 1-based place in the pending queue as the last scheduling cycle ranked it (None: that
    # cycle did not rank it, e.g. it was submitted since), the queue's length then, and when
    # that cycle ran. Read from the store, never recomputed here.
    position: int | None = None
    pending_total: int | None = None
    ranked_at: float | None = None
    placement: tuple[Allocation, ...] = ()
    exit_code: int | None = None
    history: tuple[HistoryEntry, ...] = ()  # the last few entries
    policy: str = ""  # the policy bundle this client's config names
    team_usage_gpu_s: float | None = None  # the team's past GPU-seconds, decayed to now (what
    #                                        fair share weighs; 0: no recent usage)
    reservation: Mapping[str, Any] | None = None  # the reservation it holds, if any
    blocked_by: Mapping[str, Any] | None = None  # the reservation that holds it back
    # a pending job that may burst: its on-prem start forecast, when its SLA breaks, and when
    # and where it bursts if it still waits then (what the last cycle expected; None: no
    # such outlook, e.g. an on-prem-only job, or one bursting already)
    burst: BurstOutlook | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "policy": self.policy, "team_usage_gpu_s": self.team_usage_gpu_s,
            "reservation": dict(self.reservation) if self.reservation else None,
            "blocked_by": dict(self.blocked_by) if self.blocked_by else None,
            "burst": self.burst.to_dict() if self.burst else None,
            "job_id": self.job_id, "name": self.name, "state": self.state.value,
            "team": self.team, "priority": self.priority, "rank": self.rank,
            "sla_s": self.sla_s, "attempt": self.attempt, "waited_s": round(self.waited_s, 3),
            "sla_breached": self.sla_breached, "reason_code": self.reason_code,
            "message": self.message, "position": self.position,
            "pending_total": self.pending_total, "ranked_at": self.ranked_at,
            "placement": [{"node_id": a.node_id, "gpu_ids": list(a.gpu_ids), "rank": a.rank}
                          for a in self.placement],
            "exit_code": self.exit_code,
            "history": [[h.state.value, h.time, h.reason, h.attempt] for h in self.history],
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Explanation:
        """The inverse of :meth:`to_dict` (an API server's reply; ``sla_s`` None: no SLA)."""
        return cls(**{
            **{k: d[k] for k in cls.__dataclass_fields__ if k in d},
            "state": JobState(d["state"]),
            "sla_s": math.inf if d["sla_s"] is None else d["sla_s"],
            "burst": BurstOutlook.from_dict(d["burst"]) if d.get("burst") else None,
            "placement": tuple(Allocation(a["node_id"], tuple(a["gpu_ids"]), a["rank"])
                               for a in d["placement"]),
            "history": tuple(HistoryEntry(JobState(h[0]), h[1], h[2], h[3])
                             for h in d["history"])})


@dataclass(frozen=True)
class NodeView:
    """One node as an operator sees it."""

    id: str
    state: str  # READY, DRAINING, DOWN, or EXPIRED (lease ran out, not yet reconciled)
    site: str
    hostname: str
    gpus_total: Mapping[str, int]  # device kind ("A100-80GB", "A100-80GB/1g.10gb") -> count
    gpus_free: Mapping[str, int]
    jobs: tuple[str, ...]  # ids of jobs holding GPUs here
    lease_age_s: float  # seconds since the last heartbeat
    lease_left_s: float  # seconds until the lease runs out (negative: expired)
    cpus: float = 0.0
    memory_gb: float = 0.0
    labels: Mapping[str, str] = field(default_factory=dict)
    instance_id: str = ""  # the cloud machine it runs on ("" on-prem)
    price_per_hour: float | None = None  # that machine's price (None: on-prem or unknown)
    instance_age_s: float | None = None  # since that machine was requested
    isolation: str = ""  # what keeps its jobs apart, as its agent says ("uid per team", or
    # why not: "none: agent not root, jobs run as its user"; workers/users.py)

    @property
    def total(self) -> int:
        return sum(self.gpus_total.values())

    @property
    def free(self) -> int:
        return sum(self.gpus_free.values())

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id, "state": self.state, "site": self.site, "hostname": self.hostname,
            "gpus_total": dict(self.gpus_total), "gpus_free": dict(self.gpus_free),
            "jobs": list(self.jobs), "lease_age_s": round(self.lease_age_s, 3),
            "lease_left_s": round(self.lease_left_s, 3), "cpus": self.cpus,
            "memory_gb": self.memory_gb, "labels": dict(self.labels),
            **({"isolation": self.isolation} if self.isolation else {}),
            **({"instance_id": self.instance_id, "price_per_hour": self.price_per_hour,
                "instance_age_s": None if self.instance_age_s is None
                else round(self.instance_age_s, 3)} if self.instance_id else {}),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> NodeView:
        """The inverse of :meth:`to_dict` (an API server's reply)."""
        kept = {k: d[k] for k in cls.__dataclass_fields__ if k in d}
        return cls(**{**kept, "jobs": tuple(kept.get("jobs", ()))})


def resolve_url(redis_url: str | None, config: Config) -> str:
    """The cluster's URL: a Redis URL, or an API server's ``https://`` one (SPILLWAY_URL,
    after SPILLWAY_REDIS_URL as the CLI reads them)."""
    url = (redis_url or os.environ.get("SPILLWAY_REDIS_URL")
           or url_from_file(os.environ.get("SPILLWAY_REDIS_URL_FILE", ""))
           or os.environ.get("SPILLWAY_URL") or config.redis_url)
    if not url:
        raise ConfigError(
            "no Redis URL: pass redis_url / --redis-url, set SPILLWAY_REDIS_URL, set redis_url "
            "in the config file, or start a local cluster with `spillway up` (or set "
            "SPILLWAY_URL=https://... and SPILLWAY_TOKEN for an API server)"
        )
    return url


def parse_states(state: StateFilter) -> set[JobState] | None:
    """``"pending"``, ``"RUNNING,STARTING"``, a JobState or an iterable of them."""
    if state is None:
        return None
    items = [state] if isinstance(state, (str, JobState)) else builtins.list(state)
    out: set[JobState] = set()
    for item in items:
        if isinstance(item, JobState):
            out.add(item)
            continue
        for part in str(item).split(","):
            name = part.strip().upper()
            if not name:
                continue
            if name not in JobState.__members__:
                raise SpecError([FieldError("state", f"unknown job state {part.strip()!r}",
                                            ", ".join(JobState.__members__))])
            out.add(JobState[name])
    return out or None


def submit_workdir(workdir: str | None) -> str | None:
    """A workdir made absolute against the directory it is submitted from, as Slurm does: no
    workdir is the submit directory itself. (The agent runs the job there where that directory
    exists on its node, and in a directory of the job's own otherwise.)"""
    if workdir and (os.path.isabs(workdir) or workdir.startswith("~")):
        return workdir
    try:
        here = os.getcwd()
    except OSError:  # the submit directory was removed: the agent picks one
        return workdir
    return os.path.normpath(os.path.join(here, workdir)) if workdir else here


def _workdir_of(data: dict[str, Any]) -> dict[str, Any]:
    return {**data, "workdir": submit_workdir(data.get("workdir"))}


def _in_submit_dir(spec: JobSpec) -> JobSpec:
    workdir = submit_workdir(spec.workdir)
    return spec if workdir == spec.workdir else spec.model_copy(update={"workdir": workdir})


def merged(spec: JobSpec | Mapping[str, Any] | None, fields: Mapping[str, Any]
           ) -> dict[str, Any]:
    """A spec (JobSpec, mapping or None) and keyword fields as one mapping of fields."""
    if isinstance(spec, JobSpec):
        return {**spec.model_dump(exclude_unset=True), **fields}
    if spec is None:
        return dict(fields)
    if isinstance(spec, Mapping):
        return {**spec, **fields}
    raise SpecError([FieldError("spec", f"expected a JobSpec or a mapping, got "
                                        f"{type(spec).__name__}")])


class Client:
    """A connection to one Spillway cluster: its Redis (``redis://``), or an API server
    (``https://``, with a token: broker/api/remote.py carries the calls)."""

    def __init__(self, redis_url: str | None = None, config: Config | None = None) -> None:
        self.config = config or load_config()
        self.redis_url = resolve_url(redis_url, self.config)
        self._rt = Runtime(self.config, self.redis_url)
        self.actor: str | None = None  # who acts, for the job history (set by acting_as)
        self._remote: Any = None
        if self.redis_url.startswith(("http://", "https://")):
            from broker.api.remote import Remote

            self._remote = Remote(self.redis_url, self.config)

    def acting_as(self, actor: str) -> Client:
        """This client (same connections) acting for ``actor``, who is named in the history
        of what it submits, cancels and drains; submitted workdirs are taken as given (an API
        server's directory is not its caller's)."""
        other = copy.copy(self)
        other.actor = actor
        return other

    def _direct(self) -> Runtime:
        if self._remote is not None:
            raise ConfigError(f"{self.redis_url} is an API server: this needs a redis:// URL "
                              "(operators' direct access to the store)")
        return self._rt

    # -- lifecycle -------------------------------------------------------------------------------

    @property
    def store(self) -> BaseStore:
        """The cluster's store; an unreachable Redis raises StoreUnreachable."""
        return guarded(self._direct().store, self.redis_url)

    @property
    def store_redis(self) -> redis.Redis:
        """A plain Redis client on the cluster's database (for tools and benchmarks); an
        unreachable Redis raises StoreUnreachable."""
        return guarded(self._direct().redis, self.redis_url)

    @property
    def celery(self) -> Celery:
        """The Celery app, configured for this cluster."""
        return self._direct().celery

    def close(self) -> None:
        """Close this client's Redis connections (safe to call twice)."""
        if self._remote is not None:
            self._remote.close()
        made = self._rt.__dict__
        if "store" in made:
            close = getattr(made.pop("store"), "close", None)
            if close is not None:
                close()
        if "redis" in made:
            made.pop("redis").close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _point_celery(self) -> Runtime:
        """Celery's app is process-wide: aim it at this client's cluster before publishing, in
        case another client in this process (tests, tools) aimed it elsewhere."""
        if self._rt.celery.conf.broker_url != self.redis_url:
            from broker.bus.app import configure

            configure(self._rt.celery, self.redis_url, self.config)
        return self._rt

    def _trigger(self) -> None:
        from broker.bus import commands

        self._point_celery()
        commands.trigger_cycle(self.store_redis)

    # -- jobs ------------------------------------------------------------------------------------

    def _spec(self, spec: JobSpec | Mapping[str, Any] | None, fields: Mapping[str, Any]) -> JobSpec:
        parsed = self._parsed(spec, fields)
        return parsed if self.actor is not None else _in_submit_dir(parsed)

    def _parsed(self, spec: JobSpec | Mapping[str, Any] | None, fields: Mapping[str, Any]
                ) -> JobSpec:
        if isinstance(spec, JobSpec) and not fields:
            return spec.checked(self.config)
        return JobSpec.parse(merged(spec, fields), self.config)

    def _feasible(self, specs: builtins.list[JobSpec], hold: bool | None,
                  prefix: bool = False) -> None:
        """SpecError when no registered node (up, or dead for less than
        ``node_forget_after_s``) and no cloud offer the job may burst to could ever hold one
        of ``specs``, unless ``hold`` (default: the ``hold_if_infeasible`` setting)."""
        if self.config.hold_if_infeasible if hold is None else hold:
            return
        from broker.cycle import feasible

        nodes, offers = self.store.nodes(), self._offers()  # once for the whole batch
        now, cfg = time.time(), self.config
        problems: builtins.list[FieldError] = []
        for i, spec in enumerate(specs):
            problems += [FieldError(f"[{i}].{p.field}", p.problem, p.allowed) if prefix else p
                         for p in feasible.problems(spec, nodes, offers, classes=cfg.classes,
                                                    now=now,
                                                    forget_after_s=cfg.node_forget_after_s)]
        if problems:
            raise SpecError(problems)

    def _offers(self) -> tuple[Offer, ...]:
        """The cloud offers a job could be rented on: those the provisioner published (cooling
        zones included: they come back)."""
        return tuple(self.store.offers(time.time(), include_blocked=True))

    def submit(self, spec: JobSpec | Mapping[str, Any] | None = None, *,
               hold_if_infeasible: bool | None = None, **fields: Any) -> Job:
        """Validate and queue one job; returns it PENDING. SpecError stores nothing, also when
        no registered node could ever hold the job (unless ``hold_if_infeasible``)."""
        if self._remote is not None:
            return self._remote.submit(_workdir_of(merged(spec, fields)), hold_if_infeasible)
        checked = self._spec(spec, fields)
        self._feasible([checked], hold_if_infeasible)
        job = self.store.submit(checked, now=time.time(), reason=self._by("Submitted"))
        self._trigger()
        return job

    def submit_many(self, specs: Iterable[JobSpec | Mapping[str, Any]], *,
                    hold_if_infeasible: bool | None = None) -> builtins.list[Job]:
        """Validate every spec, then queue them all in one write, or none of them."""
        if self._remote is not None:
            return self._remote.submit_many([_workdir_of(merged(s, {})) for s in specs],
                                            hold_if_infeasible)
        checked: builtins.list[JobSpec] = []
        problems: builtins.list[FieldError] = []
        for i, spec in enumerate(specs):
            try:
                checked.append(self._spec(spec, {}))
            except SpecError as e:
                problems += [FieldError(f"[{i}].{p.field}", p.problem, p.allowed)
                             for p in e.errors]
        if problems:
            raise SpecError(problems)
        if not checked:
            return []
        self._feasible(checked, hold_if_infeasible, prefix=True)
        jobs = self.store.submit_many(checked, now=time.time(), reason=self._by("Submitted"))
        self._trigger()
        return jobs

    def get(self, job_id: str) -> Job:
        """The job's current record; JobNotFound if there is none."""
        if self._remote is not None:
            return self._remote.get(job_id)
        return self.store.get(job_id)

    def _by(self, what: str) -> str:
        return what if self.actor is None else f"{what} by {self.actor}"

    def list(self, state: StateFilter = None, team: str | None = None,
             priority: str | None = None, limit: int | None = None,
             skip: int = 0) -> builtins.list[Job]:
        """Jobs oldest first; ``limit`` keeps the newest N, after skipping the newest ``skip``
        (pages back). Jobs finished more than ``retain_finished_s`` ago are not listed;
        :meth:`get` still reads them."""
        if self._remote is not None:
            return self._remote.list(parse_states(state), team, priority, limit, skip)
        return self.store.list_jobs(parse_states(state), team=team, priority=priority,
                                    limit=limit, skip=skip)

    def cancel(self, job_id: str) -> Job:
        """Cancel a job: a queued one ends at once, a placed one is stopped (SIGTERM, grace,
        SIGKILL). Cancelling a finished job changes nothing and returns it."""
        if self._remote is not None:
            return self._remote.cancel(job_id)
        job = self.store.cancel(job_id, now=time.time(),
                                reason="Cancelled by user" if self.actor is None
                                else self._by("Cancelled"))
        if job.state is JobState.STOPPING:
            from broker.bus import commands

            commands.stop_jobs(self._point_celery().celery, [job], self.config.grace_s)
        return job

    def wait(self, job_id: str, timeout: float | None = None, poll_s: float = 0.2) -> Job:
        """Block until the job is SUCCEEDED, FAILED or CANCELLED; JobTimeout otherwise."""
        if self._remote is not None:
            job, done = self._remote.wait(job_id, timeout)
            if not done:
                raise JobTimeout(job, timeout or 0.0)
            return job
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            job = self.get(job_id)
            if job.state in TERMINAL:
                return job
            if deadline is not None and time.monotonic() >= deadline:
                raise JobTimeout(job, timeout or 0.0)
            pause = poll_s if deadline is None else min(poll_s, deadline - time.monotonic())
            time.sleep(max(pause, 0.0))

    def logs(self, job_id: str, attempt: int | None = None, follow: bool = False,
             since: str = "0") -> Iterator[LogLine]:
        """An attempt's output lines (default: the current attempt). With ``follow``, keep
        reading until the job ends or moves to a later attempt, and the stream is drained."""
        if self._remote is not None:
            yield from self._remote.logs(job_id, attempt, follow, since)
            return
        job = self.get(job_id)
        attempt = job.attempt if attempt is None else attempt
        cursor = since
        while True:
            lines = self.store.read_logs(job_id, attempt, cursor, limit=1000,
                                         block_s=1.0 if follow else 0.0)
            for line in lines:
                cursor = line.cursor
                yield line
            if lines:
                continue
            if not follow:
                return
            job = self.get(job_id)
            if job.state in TERMINAL or job.attempt != attempt:
                # Appends are fenced on the attempt: once it is over nothing more arrives.
                yield from self.logs(job_id, attempt, follow=False, since=cursor)
                return

    # -- why -------------------------------------------------------------------------------------

    def explain(self, job_id: str) -> Explanation:
        """Why the job is in its state: its class and SLA, how long it waited, the scheduler's
        reason and its place in the queue (both as the last cycle recorded them in the store),
        and how it ended if it did. Reads the store only; nothing is recomputed here."""
        if self._remote is not None:
            return Explanation.from_dict(self._remote.explain(job_id))
        now = time.time()
        job = self.get(job_id)
        cls = self.config.priority(job.priority)
        rank, sla = (cls.rank, cls.sla_s) if cls else (0, float("inf"))
        queued_at = next((h.time for h in reversed(job.history)
                          if h.state is JobState.PENDING), job.submitted_at)
        if job.state is JobState.PENDING:
            waited = now - queued_at
        else:
            started = job.attempts[-1].started_at if job.attempts else None
            end = started if started is not None else (job.finished_at or now)
            waited = max(0.0, end - queued_at)
        extra: dict[str, Any] = {"policy": self.config.policy}
        if job.state is JobState.PENDING:
            order = self.store.last_order()
            reason = job.pending_reason or self._no_reason(order, now)
            if order is not None:
                extra.update(position=order.position(job.id), pending_total=order.total,
                             ranked_at=order.at)
            extra.update(self._context(job, reason, now))
            extra["burst"] = reason.burst
        else:
            reason = _state_reason(job, now)
        return Explanation(
            job_id=job.id, name=job.name, state=job.state, team=job.team, priority=job.priority,
            rank=rank, sla_s=sla, attempt=job.attempt, waited_s=waited,
            sla_breached=job.state is JobState.PENDING and waited > sla,
            reason_code=reason.code, message=reason.message, placement=job.allocations,
            exit_code=job.exit_code, history=job.history[-8:], **extra,
        )

    def _no_reason(self, order: QueueOrder | None, now: float) -> Reason:
        """A pending job without a recorded reason: do the cycles fail, has one run lately?"""
        failed = self.store.cycle_failures(since=now - 600.0)
        if failed and (order is None or failed[0][0] > order.at):
            return Reason("CyclesFailing", f"the scheduler runs but its cycles fail ("
                                           f"{len(failed)} in the last 10 min, the last "
                                           f"{now - failed[0][0]:.0f}s ago: {failed[0][1]}); "
                                           "nothing is scheduled until that is fixed; "
                                           "`spillway status` shows it, the scheduler's log "
                                           "has the traceback")
        if order is None:
            return Reason("NotScheduledYet", "no scheduling cycle has run on this cluster yet; "
                                             "is `spillway scheduler` running?")
        age = now - order.at
        if age > max(10.0, 5 * self.config.cycle_s):
            return Reason("SchedulerIdle", f"the last scheduling cycle ran {age:.0f}s ago; "
                                           "is `spillway scheduler` still running?")
        return Reason("NotScheduledYet", "submitted moments ago; the next scheduling cycle "
                                         "will consider it")

    def _context(self, job: Job, reason: Reason, now: float) -> dict[str, Any]:
        """What the store keeps that bears on a pending job: the reservation it holds or waits
        behind, and its team's decayed usage (what fair share weighs)."""
        out: dict[str, Any] = {"team_usage_gpu_s": round(self.store.usage(now).get(job.team,
                                                                                     0.0), 1)}
        res = self.store.reservation()
        if res is not None:
            if res.job_id == job.id:
                out["reservation"] = res.to_dict()
            elif reason.code == "Reservation":
                out["blocked_by"] = res.to_dict()
        return out

    # -- nodes -----------------------------------------------------------------------------------

    def drain(self, node_id: str) -> Node:
        """Take no new jobs on a node; what runs there runs to its end. NodeNotFound if none."""
        if self._remote is not None:
            return self._remote.node_state(node_id, "drain")
        return self.store.set_node_state(node_id, NodeState.DRAINING, by=self.actor or "operator")

    def resume(self, node_id: str) -> Node:
        """Let a drained node take jobs again, and schedule at once."""
        if self._remote is not None:
            return self._remote.node_state(node_id, "resume")
        node = self.store.set_node_state(node_id, NodeState.READY, by=self.actor or "operator")
        self._trigger()
        return node

    def forget_node(self, node_id: str, force: bool = False) -> builtins.list[Job]:
        """Remove a dead node from the store (its record, and from every submit-time check):
        NodeNotFound for an unknown node; NodeBusy while its agent is alive, or while jobs are
        recorded on it unless ``force`` (they are requeued, and the jobs requeued returned)."""
        if self._remote is not None:
            raise SpillwayError("forgetting a node needs the cluster's Redis (an operator's "
                                "--redis-url), not the HTTPS API")
        lost = self.store.forget_dead_node(node_id, time.time(), force)
        if lost:
            self._trigger()
        return lost

    def nodes(self) -> builtins.list[NodeView]:
        """Every registered node with its GPUs (total and free, by kind) and running jobs."""
        if self._remote is not None:
            return [NodeView.from_dict(d) for d in self._remote.nodes()]
        now = time.time()
        nodes = self.store.nodes()
        held = self.store.allocations([n.id for n in nodes])
        views = [_node_view(n, held.get(n.id, {}), now, self.config.lease_ttl_s) for n in nodes]
        if not any(n.instance_id for n in nodes):
            return views
        rented = {i.provider_id: i for i in self.store.instances() if i.provider_id}
        return [replace(v, instance_id=n.instance_id,
                        price_per_hour=rented[n.instance_id].price_per_hour,
                        instance_age_s=now - rented[n.instance_id].requested_at)
                if n.instance_id in rented else replace(v, instance_id=n.instance_id)
                for v, n in zip(views, nodes)]


def _kind(gpu: Any) -> str:
    return f"{gpu.model}/{gpu.mig_profile}" if gpu.mig_profile else gpu.model


def _node_view(node: Node, held: Mapping[str, str], now: float, ttl: float) -> NodeView:
    devices = node.allocatable
    total = Counter(_kind(g) for g in devices)
    free = Counter(_kind(g) for g in devices if g.id not in held)
    jobs = tuple(dict.fromkeys(owner.rsplit(":", 1)[0] for owner in held.values()))
    state = node.state.value
    if node.state is not NodeState.DOWN and node.lease_expires <= now:
        state = "EXPIRED"
    return NodeView(
        id=node.id, state=state, site=node.site, hostname=node.hostname,
        gpus_total=dict(sorted(total.items())),
        gpus_free={k: free.get(k, 0) for k in sorted(total)},
        jobs=jobs, lease_age_s=max(0.0, now - (node.lease_expires - ttl)),
        lease_left_s=node.lease_expires - now, cpus=node.cpus, memory_gb=node.memory_gb,
        labels=dict(node.labels), isolation=node.isolation,
    )


def _state_reason(job: Job, now: float) -> Reason:
    nodes = ", ".join(job.node_ids) or "?"
    last = job.history[-1] if job.history else None
    why = last.reason if last else ""
    if job.state is JobState.STARTING:
        return Reason("Starting", f"placed on {nodes}; waiting for the agent to start it")
    if job.state is JobState.RUNNING:
        since = now - (job.started_at or now)
        return Reason("Running", f"running on {nodes} for {since:.0f}s (attempt {job.attempt})")
    if job.state is JobState.STOPPING:
        target = job.stop_target.value.lower() if job.stop_target else "stopped"
        return Reason("Stopping", f"being {target} on {nodes}: {why}; waiting for its "
                                  "process to exit")
    ran = ""
    if job.started_at is not None and job.finished_at is not None:
        ran = f" after running {job.finished_at - job.started_at:.0f}s"
    if job.state is JobState.SUCCEEDED:
        return Reason("Succeeded", f"exited 0{ran}")
    if job.state is JobState.FAILED:
        code = f", exit code {job.exit_code}" if job.exit_code is not None else ""
        return Reason("Failed", f"{why}{code}{ran}")
    if job.state is JobState.CANCELLED:
        return Reason("Cancelled", f"{why}{ran}")
    return Reason(job.state.value.title(), why)
