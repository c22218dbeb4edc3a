"""Every Celery command Spillway sends, by name, and nothing else.

Messages carry ids, never state (DESIGN.md, Convention 11): whoever consumes one re-reads the
store. Commands are sent with ``send_task`` by name, so a sender needs no task code: the agent,
the client, the actuator and the reconciler import this module, and only the process that
consumes a queue registers the tasks for it (``workers.tasks`` in a worker agent for
``node.<id>``; nothing consumes ``provision`` yet). The scheduling cycle is not a Celery task:
the leading scheduler blocks on a Redis list, and :func:`trigger_cycle` pushes onto it.

This module imports Celery and :mod:`broker.bus.app` only; a Redis client is passed in where a
command needs one (the cycle trigger), and jobs are anything shaped like one
(:class:`PlacedJob`).
"""

from __future__ import annotations

import logging
import queue
import threading
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol

from celery import Celery

from broker.bus.app import PROVISION_QUEUE, node_queue

# -- task names -----------------------------------------------------------------------------

START_JOBS = "spillway.start_jobs"  # node.<id>: [[job id, attempt], ...] to start there
STOP_JOB = "spillway.stop_job"  # node.<id>: job id, attempt, grace s (SIGTERM, grace, SIGKILL)
PING = "spillway.ping"  # node.<id> (or any queue): a no-op, for measuring raw Celery
LAUNCH = "spillway.launch"  # provision: offer id, count, request id, for which jobs
TERMINATE = "spillway.terminate"  # provision: instance ids, reason

NODE_TASKS = (START_JOBS, STOP_JOB, PING)
PROVISION_TASKS = (LAUNCH, TERMINATE)

# The cycle trigger's Redis keys: DIRTY says something changed since the last cycle began;
# WAKE is the list the leading scheduler blocks on between cycles (at most one element, so a
# burst of triggers wakes it once).
DIRTY = "sw:cycle:dirty"
WAKE = "sw:cycle:wake"


class Part(Protocol):
    @property
    def node_id(self) -> str: ...

    @property
    def rank(self) -> int: ...


class PlacedJob(Protocol):
    """What a start or stop needs of a job (:class:`broker.model.Job` is one)."""

    @property
    def id(self) -> str: ...

    @property
    def attempt(self) -> int: ...

    @property
    def allocations(self) -> Sequence[Part]: ...

    @property
    def parts_exited(self) -> Sequence[tuple[int, int]]: ...


class RedisLike(Protocol):
    def pipeline(self, transaction: bool = ...) -> Any: ...


log = logging.getLogger(__name__)


class Outbox:
    """Commands sent in order by a thread of their own, so that the leading scheduler's
    cycle does not wait out their round trips: it commits its starts, hands their messages
    here and goes on to the next snapshot while they are published.

    Nothing is lost that a synchronous send would have kept: a start is committed before its
    message is queued here, and a message that never leaves (the process dies, Redis is
    down) is what the reconciler already repairs, by sending again the start of a job that
    stays STARTING and the stop of one that stays STOPPING. A send that fails is logged and
    dropped for the same reason."""

    def __init__(self, name: str = "spillway-outbox") -> None:
        self._q: queue.SimpleQueue[tuple[Callable[..., object], tuple[Any, ...]] | None] = \
            queue.SimpleQueue()
        self._idle = threading.Condition()
        self._pending = 0
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def post(self, fn: Callable[..., object], *args: Any) -> None:
        """Call ``fn(*args)`` on the outbox's thread, after everything posted before."""
        with self._idle:
            self._pending += 1
        self._q.put((fn, args))

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until everything posted so far was sent (or failed); False on timeout."""
        with self._idle:
            return self._idle.wait_for(lambda: self._pending == 0, timeout)

    def close(self, timeout: float = 5.0) -> bool:
        """Send what is queued (waiting at most ``timeout``), then end the thread."""
        done = self.flush(timeout)
        self._q.put(None)
        return done

    def _run(self) -> None:
        while (item := self._q.get()) is not None:
            fn, args = item
            try:
                fn(*args)
            except Exception as e:  # repaired by the reconciler's resend (above)
                log.warning("a command was not sent (%s: %s); the reconciler sends it again",
                            type(e).__name__, e)
            finally:
                with self._idle:
                    self._pending -= 1
                    if self._pending == 0:
                        self._idle.notify_all()


# -- node.<id> ------------------------------------------------------------------------------


def start_jobs(celery: Celery, jobs: Iterable[PlacedJob]) -> int:
    """One ``start_jobs`` message per node, carrying that node's (job id, attempt) pairs.
    Returns the number of messages sent."""
    by_node: dict[str, list[list[object]]] = defaultdict(list)
    for job in jobs:
        for part in job.allocations:
            by_node[part.node_id].append([job.id, job.attempt])
    for node_id, items in by_node.items():
        celery.send_task(START_JOBS, args=[items], queue=node_queue(node_id))
    return len(by_node)


def stop_jobs(celery: Celery, jobs: Iterable[PlacedJob], grace_s: float) -> int:
    """Tell the node of every part not yet exited to stop it: SIGTERM, ``grace_s``, SIGKILL.
    Returns the number of messages sent."""
    sent = 0
    for job in jobs:
        exited = {rank for rank, _ in job.parts_exited}
        for part in job.allocations:
            if part.rank not in exited:
                celery.send_task(STOP_JOB, args=[job.id, job.attempt, float(grace_s)],
                                 queue=node_queue(part.node_id))
                sent += 1
    return sent


def ping(celery: Celery, queue: str, n: int = 0) -> None:
    """A no-op message (``spillway bench dispatch`` measures raw Celery with it)."""
    celery.send_task(PING, args=[n], queue=queue)


# -- control --------------------------------------------------------------------------------


def trigger_cycle(redis: RedisLike) -> None:
    """Ask for a scheduling cycle soon: mark the queue dirty and wake the leading scheduler.
    One round trip; bursts of triggers coalesce into one cycle (the leader loops while the
    queue was dirtied during a cycle, so no trigger is lost)."""
    pipe = redis.pipeline(transaction=False)
    pipe.set(DIRTY, 1)
    pipe.lpush(WAKE, 1)
    pipe.ltrim(WAKE, 0, 0)
    pipe.execute()


# -- provision (nothing consumes these yet) -------------------------------------------------


def launch(celery: Celery, offer_id: str, count: int, request_id: str,
           for_jobs: Sequence[str] = ()) -> None:
    """Rent ``count`` instances of an offer; ``request_id`` makes the launch idempotent."""
    celery.send_task(LAUNCH, args=[offer_id, int(count), request_id, list(for_jobs)],
                     queue=PROVISION_QUEUE)


def terminate(celery: Celery, instance_ids: Sequence[str], reason: str) -> None:
    """Give instances back (a missing one is not an error for the provider)."""
    celery.send_task(TERMINATE, args=[list(instance_ids), reason], queue=PROVISION_QUEUE)
