"""The agent process: what ``spillway worker`` and ``python -m workers`` run around an
:class:`~workers.agent.Agent` (:func:`run_agent`): log redaction, GPU discovery, waiting for
Redis, the node's Celery worker (pool ``solo``, only ``node.<id>``, no acknowledgements), spot
interruption notices, the keeper that kills the jobs if the process dies, ``/metrics``, and the
signals: a first SIGTERM or SIGINT drains the node, a second kills its jobs at once.

Threads of an agent process:

* **main**: the Celery worker (pool ``solo``) consuming only ``node.<id>``; it runs
  :meth:`Agent.start_jobs` and :meth:`Agent.stop_job`. After Celery stops (SIGTERM, SIGINT) the
  main thread drains the node and returns.
* **heartbeat**: renews the node's lease every ``heartbeat_s`` and reconciles, level-triggered,
  what runs here against the store (:meth:`Agent.reconcile`): a lost start message, a lost stop
  message or a missed requeue never leaves a job wrong for longer than one heartbeat.
* the runner's **supervisor** thread (forks and watches job processes) and **reporter** thread
  (writes logs, reports exits); see :mod:`workers.runner`.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import uuid
from typing import Any

from broker.config.core import Config
from broker.errors import ConfigError, StoreUnreachable
from broker.metrics.agent import agent_metrics
from broker.metrics.http import Guard, serve
from broker.model import Node, NodeState
from broker.store.reach import wait_for_redis
from workers.agent import Agent
from workers.channel import RedisChannel
from workers.interruptions import make_watcher
from workers.keeping import Keeper
from workers.procs import make_undumpable

log = logging.getLogger("workers.agent")  # (the agent's log, as before the split)


def make_node(node_id: str, gpus: list[Any], cpus: float | None, memory_gb: float | None,
              labels: dict[str, str] | None, site: str, instance_id: str = "") -> Node:
    if memory_gb is None:
        import psutil

        memory_gb = round(psutil.virtual_memory().total / 2**30, 1)
    return Node(node_id, tuple(gpus), site=site, hostname=socket.gethostname(),
                cpus=float(cpus if cpus is not None else os.cpu_count() or 1),
                memory_gb=float(memory_gb), labels=dict(labels or {}),
                state=NodeState.READY, incarnation=uuid.uuid4().hex, instance_id=instance_id)


def run_agent(redis_url: str, config: Config, node_id: str | None = None,
              gpus: str | None = None, inventory: str | None = None,
              cpus: float | None = None, memory_gb: float | None = None,
              labels: dict[str, str] | None = None, site: str = "onprem",
              work_dir: str | None = None, instance_id: str = "") -> int:
    """Run a worker agent until SIGTERM or SIGINT; then drain and return the exit code."""
    import redis

    from broker.bus import commands
    from broker.bus.app import app, configure, node_queue
    from workers.discovery import discover
    from workers.tasks import set_node_handler  # registers this queue's tasks

    guard = Guard.from_config(config)  # (a wrong metrics_* setting: ConfigError now)
    from broker.security.redact import install_log_redaction, url_password

    install_log_redaction(extra=[url_password(redis_url), config.metrics_token,
                                 config.metrics_basic_auth])  # no secret in a log line
    make_undumpable()  # no job can read this process's memory, environment or descriptors
    if url_password(os.environ.get("SPILLWAY_REDIS_URL", "") or ""):
        log.warning("the agent's Redis password is in its environment (SPILLWAY_REDIS_URL): "
                    "give it a file instead, --redis-url-file or SPILLWAY_REDIS_URL_FILE (mode "
                    "0600)")
    for var in ("SPILLWAY_REDIS_URL", "SPILLWAY_REDIS_URL_FILE"):  # (nothing it starts gets
        os.environ.pop(var, None)  # them: the keeper, the jobs)
    stop_requested = _early_signal_handlers()
    node_id = node_id or socket.gethostname()
    try:
        found = discover(gpus, inventory, node_id)
    except ValueError as e:
        log.error("%s", e)
        return 2
    log.info("node %s: %d GPU devices: %s", node_id, len(found),
             ", ".join(f"{g.id} ({g.mig_profile or g.model})" for g in found) or "none")
    node = make_node(node_id, found, cpus, memory_gb, labels, site, instance_id)
    try:  # one line per attempt while Redis does not answer; exit 1 after redis_retry_s
        if not wait_for_redis(redis_url, config.redis_retry_s, stop_requested, "worker", log):
            return 0  # stopped (SIGTERM, SIGINT) while waiting: nothing ran yet
    except StoreUnreachable as e:
        log.error("%s. The worker exits; redis_retry_s in the configuration (or "
                  "SPILLWAY_REDIS_RETRY_S) sets how long it waits (0: forever)", e)
        return 1
    celery = configure(app, redis_url, config)
    control = redis.Redis.from_url(redis_url)  # its node's keys, and the cycle trigger's
    work_dir = work_dir or os.path.join(os.path.expanduser(config.state_dir), "agent", node_id)
    try:
        agent = Agent(RedisChannel(control, node_id), config, node, work_dir,
                      trigger=lambda: commands.trigger_cycle(control))
    except ConfigError as e:
        log.error("%s", e)
        return 2
    try:
        watcher = make_watcher(agent)  # spot interruption notices (workers/interruptions.py)
    except ValueError as e:
        log.error("%s", e)
        return 2
    keeper = Keeper(agent.isolation)  # kills the jobs if this process dies, even by SIGKILL
    if config.agent_metrics_port:
        agent_metrics().count_running(lambda: len(agent._local))
        serve(agent_metrics().registry, config.agent_metrics_port, guard=guard)
    try:
        set_node_handler(agent)
        if not agent.register(give_up=stop_requested):
            return 0  # stopped before the node was registered: nothing to drain
        if watcher is not None:
            watcher.start()
        if not stop_requested.is_set():
            _run_celery_worker(celery, node_queue(node_id), node_id)
        log.info("node %s draining: %d job part(s) get %.0fs to end", node_id,
                 len(agent.sup.parts()), config.grace_s)
        _hard_stop_on_second_signal(agent)
        clean = agent.drain()
        if not clean:
            log.warning("node %s: some job parts did not end within the grace period", node_id)
        if not stop_requested.is_set():
            log.error("node %s: the Celery worker stopped without a signal", node_id)
            return 1
        return 0
    finally:
        set_node_handler(None)
        if watcher is not None:
            watcher.stop()
        agent.close()
        keeper.stop()
        control.close()


def _early_signal_handlers() -> threading.Event:
    """Until Celery installs its own handlers, SIGTERM/SIGINT still mean a graceful stop."""
    from celery.signals import worker_shutting_down
    from celery.worker import state

    event = threading.Event()
    worker_shutting_down.connect(lambda **kw: event.set(), weak=False)

    def handler(signum: int, _frame: object) -> None:
        event.set()
        state.should_stop = 0  # what Celery's own handler does; its loop checks this

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
    return event


def _hard_stop_on_second_signal(agent: Agent) -> None:
    def handler(signum: int, _frame: object) -> None:
        agent.sup.kill_all()  # no logging or locks in a signal handler

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)


def _run_celery_worker(celery: Any, queue: str, node_id: str) -> None:
    """A Celery worker in this (main) thread: solo pool, only this node's queue."""
    import warnings

    from celery import platforms
    from celery.exceptions import SecurityWarning
    from celery.signals import setup_logging
    from kombu import Queue

    # Celery warns a worker that runs as root to use --uid, an option `spillway worker` does
    # not have: the agent runs as root on purpose, and its jobs as their teams' users
    # (workers/users.py says so at start)
    warnings.filterwarnings("ignore", category=SecurityWarning)

    # A receiver on setup_logging tells Celery to leave the agent's logging configuration alone.
    setup_logging.connect(_keep_logging, weak=False)
    celery_log = logging.getLogger("celery")
    if celery_log.level == logging.NOTSET:  # per-task INFO lines are noise in an agent
        celery_log.setLevel(max(logging.WARNING, logging.getLogger().getEffectiveLevel()))
    # Celery's consumer logs each reconnection attempt with a traceback; the heartbeat
    # thread already says, in one line a beat, that the store is unreachable.
    consumer_log = logging.getLogger("celery.worker.consumer.consumer")
    if consumer_log.level == logging.NOTSET:
        consumer_log.setLevel(logging.CRITICAL)
    # ... and warns, on every lost connection, that this setting's default changes in Celery
    # 6; it only cancels acks_late tasks, and the agent has none
    celery.conf.worker_cancel_long_running_tasks_on_connection_loss = True
    # No acknowledgements on the node's queue: kombu's Redis transport would otherwise keep
    # every delivered message in an "unacked" hash until its ack (two more round trips per
    # message, to redeliver after the 12-hour visibility timeout). Commands are idempotent
    # and level-triggered: at each heartbeat the agent reads its node's allocations and
    # starts and stops what it should (:meth:`Agent.reconcile`), and the reconciler sends again
    # a start whose job stays STARTING and a stop whose job stays STOPPING
    # (broker/control/reconciler.py), so a message lost with a dying agent is repaired within
    # heartbeats, not twelve hours.
    celery.conf.task_queues = [Queue(queue, no_ack=True)]
    base = celery.Worker

    class AgentWorker(base):  # type: ignore[misc, valid-type]
        def install_platform_tweaks(self, worker: Any) -> None:
            super().install_platform_tweaks(worker)
            # Celery re-executes itself on SIGHUP; an agent must not (its jobs would be lost).
            platforms.signals["SIGHUP"] = lambda *a: log.info("SIGHUP ignored")

    worker = AgentWorker(hostname=f"agent@{node_id}", queues=[queue], pool_cls="solo",
                         concurrency=1, without_gossip=True, without_mingle=True,
                         without_heartbeat=True, loglevel="WARNING", quiet=True,
                         redirect_stdouts=False)
    worker.start()


def _keep_logging(**_kwargs: Any) -> None:
    return None
