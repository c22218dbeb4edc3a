"""The snapshot builder: the cycle's Snapshot from the store, and what a scheduler keeps across
cycles beside it.

The store is the only source of truth and keeps no scheduling state. A scheduler process (or a
simulation) owns one :class:`SnapshotBuilder`, which keeps

- the runtime predictor (policies/order/predictor.py), fed the runtimes of the attempts finished
  since its last build (the store hands them out after a cursor, in the same round trip as the
  snapshot), and handed to the cycle read-only inside each Snapshot;
- the cycle's :class:`~policies.cycle.Memory` (caches that make a cycle cheaper);
- the carbon signals (broker/energy/carbon_signals.py): the configured source's intensity and
forecast
  per zone, cached and fetched off the cycle's path; the simulator hands its own in;
- the spot signals (broker/cloud/spot_signals.py): each spot zone's availability as the published
  offers show it, one step at a time (the simulator's cloud run keeps its own, replayed).

A second scheduler that takes over builds its own predictor from the store's runtime samples
(the last 50,000 are kept), so nothing is lost with the first one.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Protocol

from broker.cloud.spot_signals import SpotSignals
from broker.config.core import Config
from broker.cycle.plan import Snapshot
from broker.energy.carbon_signals import CarbonSignals, from_config
from broker.model import Job
from broker.store.base import BaseStore
from policies.cycle import Memory
from policies.order.predictor import RuntimePredictor


class Learner(Protocol):
    """What the builder keeps as the predictor: it learns finished runtimes and estimates
    (:class:`~policies.order.predictor.RuntimePredictor`; the simulator's ``--oracle-runtimes``
    hands in one that knows every job's true runtime)."""

    def observe(self, keys: tuple[Any, ...], runtime_s: float) -> None: ...

    def estimate(self, job: Job, quantile: float | None = None) -> float: ...


class SnapshotBuilder:
    def __init__(self, store: BaseStore, config: Config | None = None,
                 carbon: CarbonSignals | None = None) -> None:
        self.store = store
        cfg = config or store.config
        # the carbon signals: given (the simulator), else from the configuration's source
        self.carbon = carbon if carbon is not None else from_config(cfg)
        self.predictor: Learner = RuntimePredictor(
            quantile=float(cfg.policy_settings.get("predictor_quantile", 0.9)))
        self.memory = Memory()
        self.spot = SpotSignals()
        self._cursor = "0"

    def build(self, now: float) -> Snapshot:
        """The store's snapshot at ``now``, with the predictor caught up with every runtime
        finished since the last build."""
        snap, samples, cursor = self.store.read_snapshot(now, self._cursor)
        self._cursor = cursor or self._cursor
        keys, observe = RuntimePredictor.keys, self.predictor.observe
        for team, name, gpus, limit, ran in samples:
            observe(keys(team, name, gpus, limit or None), ran)
        snap = replace(snap, predictor=self.predictor)  # (with the teams' budgets: the store)
        return self.with_carbon(self.spot.dress(snap))

    def with_carbon(self, snap: Snapshot) -> Snapshot:
        """``snap`` with the carbon signals (unchanged when no source is configured)."""
        return snap if self.carbon is None else self.carbon.dress(snap)
