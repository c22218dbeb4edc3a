"""Where capacity lives and what Spillway rents: sites, cloud offers and instances.

A :class:`Site` is ``onprem`` or one cloud place and market (``aws:us-east-1:us-east-1a:spot``).
An :class:`Offer` is one way to rent GPUs there, at a price; provider-specific details go in
its ``extra`` mapping. An :class:`Instance` is a machine rented from an offer; its states follow
:data:`INSTANCE_TRANSITIONS` through :meth:`Instance.moved`. All are frozen dataclasses,
changed with ``dataclasses.replace``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from enum import Enum
from functools import cached_property
from types import MappingProxyType
from typing import Any

from broker.model.machine import StateChange, check_move, terminal_states

ONPREM = "onprem"
_NAME = re.compile(r"[a-z0-9][a-z0-9_-]*")
_NAME_HINT = "lower-case letters, digits, '-' or '_'"


class Market(str, Enum):
    SPOT = "spot"  # cheap, and the provider may take it back at short notice
    ONDEMAND = "ondemand"  # full price, kept until we give it back

    def __str__(self) -> str:
        return self.value


def _market(value: Market | str, where: str) -> Market:
    text = str(value).strip().lower().replace("-", "").replace("_", "")
    try:
        return Market(text)
    except ValueError:
        raise ValueError(f"{where}: market {str(value)!r} is not one of "
                         f"{', '.join(m.value for m in Market)}") from None


def _name(value: str, what: str, where: str) -> None:
    if not _NAME.fullmatch(value):
        raise ValueError(f"{where}: {what} {value!r} is not a name ({_NAME_HINT})")


# ---------------------------------------------------------------------------------------------
# Sites


@dataclass(frozen=True)
class Site:
    """``onprem``, or a cloud provider's region (and zone) in one market.

    Its id (``str(site)``) is ``onprem``, ``provider:region:market`` or
    ``provider:region:zone:market``; :meth:`parse` reads it back. The carbon zone (a grid
    region such as ``US-NY-NYIS``) describes the site but is not part of its identity.
    """

    provider: str = ONPREM
    region: str = ""
    zone: str = ""
    market: Market | None = None
    carbon_zone: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        where = f"site {self.provider!r}"
        if self.provider == ONPREM:
            if self.region or self.zone or self.market is not None:
                raise ValueError(f"{where}: on-prem has no region, zone or market")
            return
        _name(self.provider, "provider", where)
        where = f"site {':'.join(str(p) for p in self._parts())!r}"
        _name(self.region, "region", where)
        if self.zone:
            _name(self.zone, "zone", where)
        if self.market is None:
            raise ValueError(f"{where}: a cloud site needs a market (spot or ondemand)")
        object.__setattr__(self, "market", _market(self.market, where))

    def _parts(self) -> tuple[str, ...]:
        market = "" if self.market is None else str(self.market)
        return (self.provider, self.region, *((self.zone,) if self.zone else ()), market)

    def __str__(self) -> str:
        return ONPREM if self.is_onprem else ":".join(self._parts())

    @property
    def id(self) -> str:
        return str(self)

    @classmethod
    def parse(cls, text: str, carbon_zone: str = "") -> Site:
        """Read ``onprem``, ``provider:region:market`` or ``provider:region:zone:market``;
        raise ValueError naming the part that is wrong."""
        raw = str(text)
        parts = raw.strip().lower().split(":")
        where = f"site {raw!r}"
        if parts == [ONPREM]:
            return cls(carbon_zone=carbon_zone)
        if parts[0] == ONPREM:
            raise ValueError(f"{where}: on-prem has no region, zone or market; write 'onprem'")
        if len(parts) not in (3, 4):
            raise ValueError(f"{where}: expected 'onprem', 'provider:region:market' or "
                             f"'provider:region:zone:market', got {len(parts)} part(s)")
        provider, region, *zone, market = parts
        names = {"provider": provider, "region": region, **({"zone": zone[0]} if zone else {})}
        for what, value in names.items():
            _name(value, what, where)
        return cls(provider, region, "".join(zone), _market(market, where), carbon_zone)

    @property
    def is_onprem(self) -> bool:
        return self.provider == ONPREM

    @property
    def is_spot(self) -> bool:
        return self.market is Market.SPOT

    @property
    def kind(self) -> str:
        """The JobSpec ``sites`` word that admits this site: onprem, cloud or spot."""
        return ONPREM if self.is_onprem else "spot" if self.is_spot else "cloud"


# ---------------------------------------------------------------------------------------------
# Offers


@dataclass(frozen=True)
class Offer:
    """One cloud capacity option: an instance type in a place and market, at a price.

    Equality and hashing leave out ``extra`` (provider-specific details, read-only)."""

    provider: str
    region: str
    zone: str  # "" for an offer that any zone of the region can fill
    instance_type: str
    gpu_model: str  # canonical model, e.g. A100-80GB (broker.model.gpus)
    gpu_count: int
    gpu_memory_gb: float  # per GPU
    market: Market
    price_per_hour: float  # dollars, for the whole instance
    carbon_zone: str = ""
    extra: Mapping[str, Any] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        site = self.site  # checks provider, region, zone and market
        object.__setattr__(self, "market", site.market)
        where = f"offer {self.id!r}"
        if not self.instance_type.strip():
            raise ValueError(f"{where}: instance_type must not be empty")
        if isinstance(self.gpu_count, bool) or not isinstance(self.gpu_count, int) \
                or self.gpu_count < 1:
            raise ValueError(f"{where}: gpu_count {self.gpu_count!r} must be a whole number >= 1")
        for name in ("gpu_memory_gb", "price_per_hour"):
            value = getattr(self, name)
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"{where}: {name} {value!r} must be a number >= 0")
        object.__setattr__(self, "extra", MappingProxyType(dict(self.extra)))

    @cached_property
    def site(self) -> Site:
        return Site(self.provider, self.region, self.zone, self.market, self.carbon_zone)

    @cached_property
    def id(self) -> str:
        """``site/instance_type``, e.g. ``aws:us-east-1:us-east-1a:spot/p4d.24xlarge``."""
        return f"{self.site}/{self.instance_type}"

    @property
    def price_per_gpu_hour(self) -> float:
        return self.price_per_hour / self.gpu_count


# ---------------------------------------------------------------------------------------------
# Instances


class InstanceState(str, Enum):
    REQUESTED = "REQUESTED"  # launch sent to the provider; no machine seen yet
    BOOTING = "BOOTING"  # the provider lists the machine; its agent has not registered
    READY = "READY"  # its agent registered as a node and takes jobs
    DRAINING = "DRAINING"  # takes nothing new; released once its jobs have left
    TERMINATED = "TERMINATED"  # given back (or taken back); no longer billed
    FAILED = "FAILED"  # never became usable, or broke; the reconciler reaps what is left

    def __str__(self) -> str:
        return self.value


_I = InstanceState

INSTANCE_TRANSITIONS: dict[InstanceState, frozenset[InstanceState]] = {
    _I.REQUESTED: frozenset(
        {
            _I.BOOTING,  # the provider accepted the launch and lists the machine
            _I.FAILED,  # the provider refused it: no capacity, quota or price too low
            _I.TERMINATED,  # no longer needed; cancelled before a machine appeared
        }
    ),
    _I.BOOTING: frozenset(
        {
            _I.READY,  # its agent registered as a node
            _I.FAILED,  # it did not register within the boot timeout
            _I.TERMINATED,  # no longer needed, or reclaimed (spot) while booting
        }
    ),
    _I.READY: frozenset(
        {
            _I.DRAINING,  # idle past its keep-alive, or a spot interruption notice came
            _I.TERMINATED,  # the provider took it back without notice
            _I.FAILED,  # it broke: its node went down and the provider reports it unhealthy
        }
    ),
    _I.DRAINING: frozenset(
        {
            _I.READY,  # new demand arrived before it was released
            _I.TERMINATED,  # its jobs left (or the notice ran out) and it was given back
        }
    ),
    _I.TERMINATED: frozenset(),  # terminal
    _I.FAILED: frozenset(),  # terminal
}
"""Every legal move of a rented instance. Staying in the same state is not a move."""

INSTANCE_TERMINAL: frozenset[InstanceState] = terminal_states(INSTANCE_TRANSITIONS)


@dataclass(frozen=True)
class Instance:
    """A cloud machine Spillway rented. One launch (``request_id``, written into the
    machine's tags) may start several; ``provider_id`` tells them apart once known."""

    request_id: str
    offer_id: str
    state: InstanceState = InstanceState.REQUESTED
    provider_id: str = ""  # the cloud's own id, once it lists the machine
    node_id: str = ""  # the node its agent registered as
    requested_at: float = 0.0
    ready_at: float | None = None  # when it first became READY
    ended_at: float | None = None  # when it reached TERMINATED or FAILED
    price_per_hour: float = 0.0  # the offer's price when it was launched, whole instance
    for_jobs: tuple[str, ...] = ()  # the jobs it was launched for (none: by an operator)
    history: tuple[StateChange[InstanceState], ...] = ()

    @property
    def id(self) -> str:
        return self.provider_id or self.request_id

    @property
    def ended(self) -> bool:
        return self.state in INSTANCE_TERMINAL

    @property
    def provider(self) -> str:
        """The provider's configured name: the first part of the offer id."""
        return self.offer_id.split(":", 1)[0]

    @property
    def reason(self) -> str:
        """Why it is in its state now (its last history entry's reason)."""
        return self.history[-1].reason if self.history else ""

    def moved(self, to: InstanceState, now: float, reason: str, **changes: Any) -> Instance:
        """Move to ``to`` along an edge of INSTANCE_TRANSITIONS, recording history and the
        time it became ready or ended; raise InvalidTransition for any other move."""
        check_move(INSTANCE_TRANSITIONS, "instance", self.id, self.state, to)
        if to is InstanceState.READY and self.ready_at is None:
            changes.setdefault("ready_at", now)
        if to in INSTANCE_TERMINAL:
            changes.setdefault("ended_at", now)
        entry = StateChange(to, now, reason)
        return replace(self, state=to, history=(*self.history, entry), **changes)

    def to_dict(self) -> dict[str, Any]:
        return {
            "request_id": self.request_id,
            "offer_id": self.offer_id,
            "state": self.state.value,
            "provider_id": self.provider_id,
            "node_id": self.node_id,
            "requested_at": self.requested_at,
            "ready_at": self.ready_at,
            "ended_at": self.ended_at,
            "price_per_hour": self.price_per_hour,
            "for_jobs": list(self.for_jobs),
            "history": [[h.state.value, h.time, h.reason] for h in self.history],
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Instance:
        return cls(
            request_id=d["request_id"],
            offer_id=d["offer_id"],
            state=InstanceState(d["state"]),
            provider_id=d.get("provider_id", ""),
            node_id=d.get("node_id", ""),
            requested_at=d.get("requested_at", 0.0),
            ready_at=d.get("ready_at"),
            ended_at=d.get("ended_at"),
            price_per_hour=float(d.get("price_per_hour", 0.0)),
            for_jobs=tuple(d.get("for_jobs", ())),
            history=tuple(StateChange(InstanceState(s), t, r)
                          for s, t, r in d.get("history", ())),
        )
