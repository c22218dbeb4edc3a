"""Scheduling policies: pure functions over a Snapshot, registered by role and name.

Nothing here imports Celery, Redis or a cloud SDK.
"""

# the built-in policies register themselves with policies.registry on import
from policies import (  # noqa: F401
    backfill,
    budget,
    burst,
    burst_baselines,
    carbon_place,
    carbon_wait,
    defer,
    defrag,
    ordering,
    placement,
    predictor,
    priority,
    queue,
    relief,
    scavenge,
)
