"""The node queue's Celery tasks (``node.<id>``), registered by the worker agent's process.

Thin shells: ids in, handed to this process's :class:`NodeHandler` (the :class:`Agent`), which
re-reads the store. Senders use :mod:`broker.bus.commands`, by the same names.
"""

from __future__ import annotations

from typing import Protocol

from celery.worker.request import Request

from broker.bus import commands
from broker.bus.app import app


class Unacked(Request):  # type: ignore[misc]
    """A node command, consumed without acknowledgement: the agent consumes its queue with
    ``no_ack`` (workers/agent.py says why), so there is nothing to acknowledge, and Celery's
    ack would cost a round trip to remove the message from an "unacked" hash it never
    entered."""

    def acknowledge(self) -> None:
        self.acknowledged = True


class NodeHandler(Protocol):
    def start_jobs(self, items: list[tuple[str, int]]) -> None: ...
    def stop_job(self, job_id: str, attempt: int, grace_s: float) -> None: ...


_handler: NodeHandler | None = None


def set_node_handler(handler: NodeHandler | None) -> None:
    global _handler
    _handler = handler


def _node() -> NodeHandler:
    if _handler is None:
        raise RuntimeError("this process is not a worker agent; node commands go to node.<id>")
    return _handler


@app.task(name=commands.START_JOBS, Request=Unacked)
def start_jobs(items: list[list[object]]) -> None:
    _node().start_jobs([(str(j), int(a)) for j, a in items])  # type: ignore[call-overload]


@app.task(name=commands.STOP_JOB, Request=Unacked)
def stop_job(job_id: str, attempt: int, grace_s: float) -> None:
    _node().stop_job(job_id, int(attempt), float(grace_s))


@app.task(name=commands.PING, Request=Unacked)
def ping(n: int = 0) -> int:
    """A no-op task, for measuring raw Celery throughput beside job dispatch."""
    return n
