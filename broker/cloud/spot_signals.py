"""Spot signals in snapshots: what the scheduler has seen of each spot zone's availability.

One :class:`~policies.burst.spot_deadline.SpotMarket` per spot zone (key ``provider:zone``), fed one
step at a time (``step_s``): the recent share of time spot was up and the spot runs and gaps
of the last week, which the deadline rule of the burst policy reads
(policies/burst/spot_deadline.py,
docs/burst.md). The policies only read them from ``Snapshot.spot_markets``; this module (outside
policies/) keeps them.

Where the availability comes from:

- the scheduler (:class:`broker.cycle.snapshots.SnapshotBuilder`): the published offers, a spot
  offer with ``available: False`` meaning none now; the steps between two snapshots hold the
  availability seen at the earlier one (sample and hold), the current step the one seen now;
- the simulator (broker/sim/cloudrun.py): the replayed trace of each zone, read at each
  step's start (``Feed``), with the trace's own step, so no change is missed.

A market given at construction (``markets``) is kept as it is: the simulator's spot-deadline
bench hands over the market a scheduler would have watched before the run started.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType

from broker.cycle.plan import Snapshot
from broker.model import Offer
from policies.burst.spot_deadline import DeadlineRule, SpotMarket

DEFAULT_STEP_S = 195.0  # the step of the "Can't Be Late" traces the rule was tuned on


@dataclass(frozen=True)
class Feed:
    """A zone's availability at any time (the simulator's replay): steps of ``step_s`` start
    at ``first_s`` + k x ``step_s``."""

    step_s: float
    first_s: float
    up: Callable[[float], bool]


def zone_key(offer: Offer) -> str:
    return f"{offer.provider}:{offer.zone}"


class SpotSignals:
    def __init__(self, step_s: float = DEFAULT_STEP_S, rule: DeadlineRule | None = None,
                 feeds: Callable[[str], Feed | None] | None = None,
                 markets: Mapping[str, SpotMarket] | None = None) -> None:
        self.step_s, self.rule, self.feeds = step_s, rule or DeadlineRule(), feeds
        self.markets: dict[str, SpotMarket] = dict(markets or {})
        self._feed: dict[str, Feed | None] = {}
        self._last: dict[str, bool] = {}

    def _market(self, key: str, now: float) -> SpotMarket:
        m = self.markets.get(key)
        feed = self._feed[key] = self._feed.get(key) or (self.feeds(key) if self.feeds
                                                         else None)
        if m is None:
            step = feed.step_s if feed is not None else self.step_s
            m = self.markets[key] = self.rule.market(step / 3600.0)
            m.next_s = now if feed is None else feed.first_s
        elif not math.isfinite(m.next_s):
            m.next_s = now if feed is None else feed.first_s
        return m

    def advance(self, key: str, now: float, up_now: bool) -> SpotMarket:
        """Feed zone ``key`` every step that has started by ``now``."""
        m = self._market(key, now)
        feed, step = self._feed[key], m.step_h * 3600.0
        held = self._last.get(key, up_now)
        while m.next_s <= now + 1e-9:
            if feed is not None:
                up = feed.up(m.next_s)
            else:  # the availability seen at the last snapshot, until this step
                up = up_now if m.next_s + step > now else held
            m.observe(up)
            m.next_s += step
        self._last[key] = up_now
        return m

    def dress(self, snap: Snapshot) -> Snapshot:
        """``snap`` with ``spot_markets`` for every zone a spot offer is in (unchanged when
        there is none)."""
        seen: dict[str, bool] = {}
        for o in snap.offers:
            if o.market.value == "spot" and o.zone:
                k = zone_key(o)
                seen[k] = seen.get(k, False) or o.extra.get("available") is not False
        if not seen:
            return snap
        for k, up in seen.items():
            self.advance(k, snap.now, up)
        return replace(snap, spot_markets=MappingProxyType(
            {k: m for k, m in self.markets.items() if k in seen}))
