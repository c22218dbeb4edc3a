"""Scheduling policies: pure functions over a Snapshot, registered by role and name.

Nothing here imports Celery, Redis or a cloud SDK.
"""

# the built-in policies register themselves with policies.registry on import
from policies.burst import baselines, budget, sla  # noqa: F401
from policies.carbon import defer, place, wait  # noqa: F401
from policies.evict import defrag, priority, relief, scavenge  # noqa: F401
from policies.order import orderings, predictor  # noqa: F401
from policies.place import backfill, placement, queue  # noqa: F401
