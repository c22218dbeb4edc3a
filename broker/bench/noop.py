"""The reference of ``spillway bench dispatch``: raw Celery. A Celery worker with Celery's own
way of consuming (each message acknowledged, kept in kombu's "unacked" hash until then), the
settings of :func:`broker.bus.app.configure`, the solo pool, and one no-op task on its own queue.

The agents consume their node queues without acknowledgements (workers/agent.py); a no-op
sent through an agent's queue would therefore measure Spillway's transport, not Celery's,
and the bench's ratio (job starts per raw Celery no-op) would move with the agent's code.

Run by the bench: ``python -m broker.bench.noop REDIS_URL QUEUE``.
"""

from __future__ import annotations

import sys

from celery import Celery

from broker.bus.app import configure

NOOP = "spillway.bench.noop"

app = Celery("spillway-bench-noop")


@app.task(name=NOOP)
def noop(n: int = 0) -> int:
    """Nothing: a message in, a return, an acknowledgement."""
    return n


def main(argv: list[str]) -> None:
    url, queue = argv
    configure(app, url)
    worker = app.Worker(hostname=f"noop@{queue}", queues=[queue], pool_cls="solo",
                        concurrency=1, without_gossip=True, without_mingle=True,
                        without_heartbeat=True, loglevel="WARNING", quiet=True,
                        redirect_stdouts=False)
    worker.start()


if __name__ == "__main__":
    main(sys.argv[1:])
