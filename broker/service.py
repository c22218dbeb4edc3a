"""``spillway scheduler``: the control-plane process.

One Celery worker in this process consumes only the ``control`` queue (``spillway.cycle`` and
``spillway.reconcile``), with the solo pool and concurrency 1, so cycles never run in
parallel here (and a Redis lock keeps them apart across schedulers). The beat runs embedded,
sending both tasks on the periods in the config, as a safety net beside event triggers.
Gossip, mingle and worker heartbeats are off: nothing here needs them and they cost a Redis
round trip per second per worker.
"""

from __future__ import annotations

import os
import socket

from broker.app import CONTROL_QUEUE
from broker.config import Config
from broker.runtime import init_runtime

# The beat's schedule lives in memory: the schedule is static (from the config), and a
# restarted scheduler just starts ticking again. No celerybeat-schedule file in the cwd.
IN_MEMORY_BEAT = "celery.beat:Scheduler"


def run_scheduler(redis_url: str | None, config: Config, beat: bool = True,
                  loglevel: str = "WARNING", hostname: str | None = None) -> int:
    """Run the scheduler until SIGTERM or SIGINT (warm shutdown). Returns the exit code."""
    import broker.tasks  # noqa: F401  (registers the control queue's tasks)

    rt = init_runtime(redis_url, config)

    worker = rt.celery.Worker(
        hostname=hostname or f"scheduler-{os.getpid()}@{socket.gethostname()}",
        pool_cls="solo",
        concurrency=1,
        queues=[CONTROL_QUEUE],
        loglevel=loglevel.upper(),
        beat=beat,
        scheduler=IN_MEMORY_BEAT,
        without_gossip=True,
        without_mingle=True,
        without_heartbeat=True,
        quiet=True,
        optimization="fair",
    )
    worker.start()
    return int(worker.exitcode or 0)
