"""The control queue's Celery tasks: thin shells. Ids in; state re-read from the store.

``spillway scheduler`` imports this module and consumes ``control``. A worker agent registers
its own node tasks (:mod:`workers.tasks`); senders use :mod:`broker.commands`.
"""

from __future__ import annotations

from broker import commands
from broker.app import app
from broker.control import run_cycles
from broker.reconciler import reconcile as _reconcile
from broker.runtime import runtime


@app.task(name=commands.CYCLE, acks_late=True)
def cycle() -> int:
    return run_cycles(runtime())


@app.task(name=commands.RECONCILE, acks_late=True)
def reconcile() -> dict[str, int]:
    return _reconcile(runtime())
