"""The ``provision`` queue: its Celery tasks and the service that consumes it.

The tasks are thin (ids in; the :class:`~broker.cloud.provisioner.Provisioner` re-reads the store).
:class:`ProvisionService` runs, in threads of the process that owns the cloud credentials
(the scheduler service, or ``spillway provisioner``), a Celery worker consuming only
``provision`` (solo pool) and the lifecycle loop (every ``reconcile_s``, while
``should_reconcile()`` says so: in a scheduler, while it leads).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import Callable
from typing import Any

from broker.bus import commands
from broker.bus.app import PROVISION_QUEUE, app
from broker.cloud.provisioner import Provisioner
from providers.base import Retry

log = logging.getLogger(__name__)

RETRIES = 5  # a throttled launch is tried this many more times
RETRY_BASE_S = float(os.environ.get("SPILLWAY_PROVISION_RETRY_S", "1.0"))  # then 2x, 4x, ...

_provisioner: Provisioner | None = None


def set_provisioner(provisioner: Provisioner | None) -> None:
    global _provisioner
    _provisioner = provisioner


def _p() -> Provisioner:
    if _provisioner is None:
        raise RuntimeError("this process runs no provisioner; provision commands go to the "
                           "scheduler service or `spillway provisioner`")
    return _provisioner


def backoff_s(retries: int) -> float:
    return min(60.0, RETRY_BASE_S * 2 ** retries)


@app.task(bind=True, name=commands.LAUNCH, max_retries=RETRIES)
def launch(self: Any, offer_id: str, count: int, request_id: str,
           for_jobs: list[str] | None = None) -> None:
    del for_jobs  # (recorded on the instances when they were requested)
    try:
        _p().launch(offer_id, int(count), request_id)
    except Retry as e:
        if self.request.retries >= RETRIES:
            _p().give_up(request_id, int(count), e)
            return
        log.warning("launch %s: %s; retrying in %.0fs", request_id, e,
                    backoff_s(self.request.retries))
        raise self.retry(countdown=backoff_s(self.request.retries), exc=e) from None


@app.task(name=commands.TERMINATE)
def terminate(instance_ids: list[str], reason: str) -> None:
    _p().terminate([str(i) for i in instance_ids], str(reason))


class ProvisionService:
    """The ``provision`` consumer and the lifecycle loop, in threads of this process."""

    def __init__(self, provisioner: Provisioner,
                 should_reconcile: Callable[[], bool] = lambda: True) -> None:
        self.provisioner, self.should_reconcile = provisioner, should_reconcile
        self.stop_event = threading.Event()
        self._worker: Any = None
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        set_provisioner(self.provisioner)
        celery = self.provisioner.rt.celery
        self._worker = celery.WorkController(
            hostname=f"provisioner@{socket.gethostname()}-{os.getpid()}",
            queues=[PROVISION_QUEUE], pool_cls="solo", concurrency=1, without_gossip=True,
            without_mingle=True, without_heartbeat=True, loglevel="WARNING")
        for name, target in (("spillway-provision", self._consume),
                             ("spillway-lifecycle", self._loop)):
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)

    def _consume(self) -> None:
        # Celery's current app is per thread: without this, a task's retry() in this thread
        # is published through an unconfigured default app (amqp://localhost) and is lost
        self.provisioner.rt.celery.set_current()
        self._worker.start()

    def _loop(self) -> None:
        every = self.provisioner.rt.config.reconcile_s
        while not self.stop_event.wait(every):
            if not self.should_reconcile():
                continue
            try:
                self.provisioner.reconcile()
            except Exception as e:  # a pass that fails is tried again: say it in one line
                log.warning("lifecycle pass failed (%s: %s); trying again in %.1fs",
                            type(e).__name__, e, every)

    def stop(self, timeout: float = 10.0) -> None:
        self.stop_event.set()
        if self._worker is not None:
            self._worker.stop(in_sighandler=False)
        for thread in self._threads:
            thread.join(timeout)
        set_provisioner(None)


def run_provisioner(redis_url: str, config: Any, loglevel: str = "INFO") -> int:
    """``spillway provisioner``: the service until SIGTERM or SIGINT, and its cloud metrics
    (launches, boots, orphans: broker/metrics/cloud.py) on ``metrics_port``."""
    import signal

    from broker.bus.runtime import init_runtime
    from broker.metrics.cloud import CloudMetrics
    from broker.metrics.http import Guard, serve

    logging.basicConfig(level=loglevel.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    guard = Guard.from_config(config)  # (a metrics_* setting that is wrong: a ConfigError now)
    rt = init_runtime(redis_url, config)
    metrics = CloudMetrics()  # its launches, boots and orphans, on metrics_port (0: none)
    if config.metrics_port:
        serve(metrics.registry, config.metrics_port, guard=guard)
    service = ProvisionService(Provisioner(rt, metrics=metrics))
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    service.start()
    try:
        stop.wait()
    finally:
        service.stop()
        counts = service.provisioner.counts
        log.info("provisioner stopped: %s", ", ".join(f"{k} {v}" for k, v in
                                                       sorted(counts.items())) or "nothing done")
    return 0
