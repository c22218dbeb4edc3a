"""``spillway scheduler``: leader election and the control loop, in one process.

Run one scheduler or several; one leads. Leadership is a lease in the store
(:meth:`BaseStore.acquire_leadership`) of ``leader_lease_s``, renewed every fifth of it by a
thread of the leader, and a *fencing token* ``"<epoch>:<owner>"`` whose epoch grows with every
new leadership. Every job write of the leader's cycles and reconciler is made under that token
(:meth:`BaseStore.fenced`): the store checks, in the same atomic step as the write, that the
token still leads, so a leader that was paused or cut off past its lease cannot apply a stale
plan (:class:`~broker.errors.Fenced`); it stops leading and becomes a follower.

Followers try to take the lease every fifth of it: when a leader dies (SIGKILL, mid-cycle
included), another leads at most ``leader_lease_s`` plus a fifth of it later (1.8 s with the
defaults, under two ``cycle_s``), and plans from the store as it finds it: a half-applied plan
of the dead leader is a set of compare-and-set writes each whole or absent, and a job it left
STARTING is re-sent by the reconciler.

The leader runs a cycle at once when triggered (:func:`broker.bus.commands.trigger_cycle` pushes
onto a wake list the leader blocks on) and every ``cycle_s`` anyway, and the reconciler every
``reconcile_s``. Nothing runs in another process: there is no Celery beat to outlive the
scheduler. Leases of nodes are judged from the moment the store is reachable again after an
outage (or from the Redis server's start, after a restart): a node is not declared dead for a
silence the store itself caused.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import threading
import time
from dataclasses import dataclass, field

import redis

from broker.bus.commands import WAKE, Outbox
from broker.bus.runtime import Runtime
from broker.control.loop import run_cycles
from broker.control.reconciler import reconcile
from broker.errors import Fenced, StoreUnreachable
from broker.metrics.http import Guard, serve
from broker.metrics.scheduler import SchedulerMetrics, scheduler_metrics
from broker.store.reach import hide_password, wait_for_redis
from policies.reasons import exception_text

log = logging.getLogger(__name__)

DOWN_LOG_S = 5.0  # while Redis is down, a running scheduler says so this often


@dataclass
class Leader:
    """One scheduler's side of the election: whether it leads, and its control loop."""

    rt: Runtime
    owner: str = field(default_factory=lambda: f"{socket.gethostname()}-{os.getpid()}")
    stop: threading.Event = field(default_factory=threading.Event)
    token: str | None = None
    reachable_since: float = field(default_factory=time.time)  # the store answered again
    leaderships: int = 0
    down_since: float | None = None  # (monotonic) the store stopped answering; None: it answers
    _down_said: float = -1e9  # when an outage was last logged (one line every DOWN_LOG_S)

    @property
    def metrics(self) -> SchedulerMetrics:
        return scheduler_metrics(self.rt.config.classes)

    @property
    def lease_s(self) -> float:
        return self.rt.config.leader_lease_s

    # -- the election ----------------------------------------------------------------------

    def try_lead(self) -> bool:
        """Take the lease if no one holds it. True if this scheduler leads now."""
        token = self.rt.store.acquire_leadership(self.owner, self.lease_s, time.time())
        if token is not None and token != self.token:
            self.token = token
            self.leaderships += 1
            log.warning("leading the schedulers (token %s)", token)
        return self.token is not None

    def _renew_loop(self) -> None:
        """Renew the lease every fifth of it; on a refusal, stop leading at once."""
        while not self.stop.wait(self.lease_s / 5):
            token = self.token
            if token is None:
                continue
            try:
                held = self.rt.store.renew_leadership(token, self.lease_s, time.time())
            except redis.RedisError as e:
                self._store_down("cannot renew the leader's lease", e)
                continue
            if not held and self.token == token:
                log.warning("the leader's lease %s has ended: following", token)
                self.token = None

    def resign(self) -> None:
        token, self.token = self.token, None
        if token is not None:
            with contextlib.suppress(redis.RedisError):  # (else the lease runs out)
                self.rt.store.release_leadership(token)

    # -- the loop --------------------------------------------------------------------------

    def run(self) -> None:
        """Lead or follow until ``stop`` is set."""
        renewer = threading.Thread(target=self._renew_loop, name="spillway-lease", daemon=True)
        renewer.start()
        cfg = self.rt.config
        next_reconcile = next_archive = 0.0
        try:
            while not self.stop.is_set():
                try:
                    leading = self.token is not None or self.try_lead()
                    self.metrics.observe_leadership(leading)
                    if not leading:
                        self._store_up()  # (try_lead had an answer)
                        self.stop.wait(self.lease_s / 5)
                        continue
                    token = self.token
                    if token is None:
                        continue
                    with self.rt.store.fenced(token):
                        run_cycles(self.rt)
                        if time.monotonic() >= next_reconcile:
                            self.metrics.observe_reconcile(
                                reconcile(self.rt, judge_from=self.judge_from()))
                            next_reconcile = time.monotonic() + cfg.reconcile_s
                        if time.monotonic() >= next_archive:  # retention: once a minute
                            self.rt.store.archive_finished(time.time())
                            next_archive = time.monotonic() + 60.0
                    wait = max(0.01, min(cfg.cycle_s, next_reconcile - time.monotonic()))
                    self.rt.redis.blpop([WAKE], timeout=wait)
                    self._store_up()
                except Fenced as e:
                    log.warning("%s", e)
                    self.token = None
                except redis.RedisError as e:
                    self._store_down("scheduling paused", e)
                    self.stop.wait(min(1.0, self.lease_s / 5))
                    self.reachable_since = time.time()  # judged again from when it answers
                except Exception as e:  # a bug must not stop scheduling: say it, count it, go on
                    log.exception("a cycle failed; the next one runs in a second")
                    self.cycle_failed(e)
                    self.stop.wait(1.0)
        finally:
            self.stop.set()
            renewer.join(self.lease_s)
            self.resign()
            self.metrics.observe_leadership(False)

    def cycle_failed(self, e: Exception) -> None:
        """Count a failed cycle and record it in the store, where ``spillway status`` and
        ``explain`` read it (if the store answers: else only the count and the log)."""
        self.metrics.observe_cycle_failure()
        with contextlib.suppress(redis.RedisError):
            self.rt.store.record_cycle_failure(time.time(), exception_text(e))

    def _store_down(self, what: str, e: Exception) -> None:
        """Say that Redis does not answer: at once, then once every DOWN_LOG_S while it stays
        down (the loop retries every fifth of the lease)."""
        now = time.monotonic()
        if self.down_since is None:
            self.down_since = now
        if now - self._down_said >= DOWN_LOG_S:
            self._down_said = now
            log.warning("%s: Redis at %s does not answer (%s) for %.0fs now; retrying every "
                        "%.1fs", what, hide_password(self.rt.redis_url), e,
                        now - self.down_since, min(1.0, self.lease_s / 5))

    def _store_up(self) -> None:
        if self.down_since is not None:
            log.warning("Redis answers again after %.0fs", time.monotonic() - self.down_since)
            self.down_since, self._down_said = None, -1e9

    def judge_from(self) -> float:
        """Node leases are judged from this time at the earliest: the later of the last time
        the store became reachable to this scheduler and the store server's start."""
        return max(self.reachable_since, self.rt.store.store_started_at(time.time()))


def run_scheduler(redis_url: str | None, config: object, loglevel: str = "WARNING",
                  provisioner: bool = True) -> int:
    """Run the scheduler until SIGTERM or SIGINT. Returns the exit code. With cloud providers
    configured and ``provisioner``, it also consumes the ``provision`` queue and runs the
    machines' lifecycle while it leads (broker/cloud/tasks.py)."""
    from broker.bus.runtime import init_runtime
    from broker.config.core import Config

    assert isinstance(config, Config)
    logging.basicConfig(level=loglevel.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    guard = Guard.from_config(config)  # (a metrics_* setting that is wrong: a ConfigError now)
    rt = init_runtime(redis_url, config)
    rt.outbox = Outbox()  # node commands leave on a thread of their own (broker/bus/commands.py)
    leader = Leader(rt)
    if config.metrics_port:
        serve(leader.metrics.registry, config.metrics_port, guard=guard)

    def _stop(signum: int, frame: object) -> None:
        del signum, frame
        leader.stop.set()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    try:  # one line per attempt while Redis does not answer; exit 1 after redis_retry_s
        if not wait_for_redis(rt.redis_url, config.redis_retry_s, leader.stop, "scheduler", log):
            return 0  # stopped (SIGTERM, SIGINT) while waiting
        sealed = rt.store.seal_existing(time.time())  # once per store: jobs of before seals
        if sealed:
            log.warning("sealed the specs of %d jobs queued before this version", sealed)
    except StoreUnreachable as e:
        log.error("%s. The scheduler exits; redis_retry_s in the configuration (or "
                  "SPILLWAY_REDIS_RETRY_S) sets how long it waits (0: forever)", e)
        return 1
    service = None
    if provisioner and config.providers:
        from broker.cloud.provisioner import Provisioner
        from broker.cloud.tasks import ProvisionService

        service = ProvisionService(Provisioner(rt, metrics=leader.metrics.cloud),
                                   should_reconcile=lambda: leader.token is not None)
        service.start()
    try:  # blpop waits at most cycle_s, so a stop is seen within that
        leader.run()
    finally:
        if service is not None:
            service.stop()
        rt.outbox.close()  # what the last cycles started, sent before the process ends
    return 0
