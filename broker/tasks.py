"""Celery tasks: thin shells. Ids in; state re-read from the store; idempotent.

``start_jobs`` and ``stop_job`` run inside a worker agent, which registers itself as the node
handler; the scheduler process runs ``cycle`` and ``reconcile``.
"""

from __future__ import annotations

from typing import Protocol

from broker.app import app
from broker.control import run_cycles
from broker.reconciler import reconcile as _reconcile
from broker.runtime import runtime


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


@app.task(name="spillway.cycle", acks_late=True)
def cycle() -> int:
    return run_cycles(runtime())


@app.task(name="spillway.reconcile", acks_late=True)
def reconcile() -> dict[str, int]:
    return _reconcile(runtime())


@app.task(name="spillway.start_jobs")
def start_jobs(items: list[list[object]]) -> None:
    _node().start_jobs([(str(j), int(a)) for j, a in items])  # type: ignore[call-overload]


@app.task(name="spillway.stop_job")
def stop_job(job_id: str, attempt: int, grace_s: float) -> None:
    _node().stop_job(job_id, int(attempt), float(grace_s))


@app.task(name="spillway.ping")
def ping(n: int = 0) -> int:
    """A no-op task, for measuring raw Celery throughput beside job dispatch."""
    return n
