"""The client's Redis transport: a cluster's operations done on its store directly
(``redis://``, ``rediss://``, ``unix://``), as researchers on the cluster's network and
operators use it, and as the API server does for its callers.

A submit is checked here, against the configuration and the registered nodes and offers;
what changes the queue or a node triggers a scheduling cycle; a cancel of a placed job sends
its node the stop. Redis's client and Celery are imported when first used: ``spillway queue``
needs neither Celery nor the submit-time checks.
"""

from __future__ import annotations

import builtins
import copy
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from broker.bus.runtime import Runtime
from broker.client.inputs import in_submit_dir, merged
from broker.client.transport import SpecInput
from broker.client.views import Explanation, JobTimeout, NodeView, node_view, state_reason
from broker.config.core import Config
from broker.errors import FieldError, SpecError
from broker.model import Job, JobSpec, Node, NodeState, Reason
from broker.model.cloud import Offer
from broker.model.state import TERMINAL, JobState
from broker.store.backend import LogLine, QueueOrder
from broker.store.base import BaseStore
from broker.store.reach import guarded

if TYPE_CHECKING:
    import redis
    from celery import Celery

__all__ = ["RedisTransport"]


class RedisTransport:
    """One cluster's Redis: its store, a plain Redis client and the Celery app, each made
    when first used (:class:`broker.bus.runtime.Runtime`)."""

    def __init__(self, config: Config, url: str) -> None:
        self.config, self.url = config, url
        self.rt = Runtime(config, url)
        self.actor: str | None = None  # who acts, for the job history (set by acting_as)

    def acting_as(self, actor: str) -> RedisTransport:
        other = copy.copy(self)
        other.actor = actor
        return other

    # -- connections -----------------------------------------------------------------------------

    @property
    def store(self) -> BaseStore:
        """The cluster's store; an unreachable Redis raises StoreUnreachable."""
        return guarded(self.rt.store, self.url)

    @property
    def store_redis(self) -> redis.Redis:
        """A plain Redis client on the cluster's database; an unreachable Redis raises
        StoreUnreachable."""
        return guarded(self.rt.redis, self.url)

    @property
    def celery(self) -> Celery:
        return self.rt.celery

    def close(self) -> None:
        made = self.rt.__dict__
        if "store" in made:
            close = getattr(made.pop("store"), "close", None)
            if close is not None:
                close()
        if "redis" in made:
            made.pop("redis").close()

    def _point_celery(self) -> Runtime:
        """Celery's app is process-wide: aim it at this cluster before publishing, in case
        another client in this process (tests, tools) aimed it elsewhere."""
        if self.rt.celery.conf.broker_url != self.url:
            from broker.bus.app import configure

            configure(self.rt.celery, self.url, self.config)
        return self.rt

    def _trigger(self) -> None:
        from broker.bus import commands

        self._point_celery()
        commands.trigger_cycle(self.store_redis)

    def _by(self, what: str) -> str:
        return what if self.actor is None else f"{what} by {self.actor}"

    # -- jobs ------------------------------------------------------------------------------------

    def _spec(self, spec: SpecInput, fields: Mapping[str, Any]) -> JobSpec:
        parsed = self._parsed(spec, fields)
        return parsed if self.actor is not None else in_submit_dir(parsed)

    def _parsed(self, spec: SpecInput, fields: Mapping[str, Any]) -> JobSpec:
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

    def submit(self, spec: SpecInput, fields: Mapping[str, Any], hold: bool | None) -> Job:
        checked = self._spec(spec, fields)
        self._feasible([checked], hold)
        job = self.store.submit(checked, now=time.time(), reason=self._by("Submitted"))
        self._trigger()
        return job

    def submit_many(self, specs: Iterable[JobSpec | Mapping[str, Any]], hold: bool | None
                    ) -> builtins.list[Job]:
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
        self._feasible(checked, hold, prefix=True)
        jobs = self.store.submit_many(checked, now=time.time(), reason=self._by("Submitted"))
        self._trigger()
        return jobs

    def get(self, job_id: str) -> Job:
        return self.store.get(job_id)

    def list(self, states: set[JobState] | None, team: str | None, priority: str | None,
             limit: int | None, skip: int) -> builtins.list[Job]:
        return self.store.list_jobs(states, team=team, priority=priority, limit=limit,
                                    skip=skip)

    def cancel(self, job_id: str) -> Job:
        job = self.store.cancel(job_id, now=time.time(),
                                reason="Cancelled by user" if self.actor is None
                                else self._by("Cancelled"))
        if job.state is JobState.STOPPING:
            from broker.bus import commands

            commands.stop_jobs(self._point_celery().celery, [job], self.config.grace_s)
        return job

    def wait(self, job_id: str, timeout: float | None, poll_s: float) -> Job:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            job = self.get(job_id)
            if job.state in TERMINAL:
                return job
            if deadline is not None and time.monotonic() >= deadline:
                raise JobTimeout(job, timeout or 0.0)
            pause = poll_s if deadline is None else min(poll_s, deadline - time.monotonic())
            time.sleep(max(pause, 0.0))

    def logs(self, job_id: str, attempt: int | None, follow: bool,
             since: str) -> Iterator[LogLine]:
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
            reason = state_reason(job, now)
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
        return self.store.set_node_state(node_id, NodeState.DRAINING, by=self.actor or "operator")

    def resume(self, node_id: str) -> Node:
        node = self.store.set_node_state(node_id, NodeState.READY, by=self.actor or "operator")
        self._trigger()
        return node

    def forget_node(self, node_id: str, force: bool) -> builtins.list[Job]:
        lost = self.store.forget_dead_node(node_id, time.time(), force)
        if lost:
            self._trigger()
        return lost

    def nodes(self) -> builtins.list[NodeView]:
        now = time.time()
        nodes = self.store.nodes()
        held = self.store.allocations([n.id for n in nodes])
        views = [node_view(n, held.get(n.id, {}), now, self.config.lease_ttl_s) for n in nodes]
        if not any(n.instance_id for n in nodes):
            return views
        rented = {i.provider_id: i for i in self.store.instances() if i.provider_id}
        return [replace(v, instance_id=n.instance_id,
                        price_per_hour=rented[n.instance_id].price_per_hour,
                        instance_age_s=now - rented[n.instance_id].requested_at)
                if n.instance_id in rented else replace(v, instance_id=n.instance_id)
                for v, n in zip(views, nodes)]
