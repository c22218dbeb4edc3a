"""Policy registry: every decision of the cycle is a role; configuration picks the policy that
plays it by name, and no policy name is compared anywhere else.

The built-in policies register when the ``policies`` package is imported (its
``__init__``), so that this module imports none of them. Roles and their one signature each
(``cycle`` is the cycle in progress, :class:`policies.cycle.Cycle`; a policy reads the
snapshot through it and writes only through it):

===========  ==========================================================================
order        ``fn(cycle, jobs) -> list[Job]``: the pending queue, first to last
admit        ``fn(cycle, job) -> str | None``: a refusal reason code, or None to admit
place        a :class:`policies.cycle.Placer`: where a job starts on free GPUs
reserve      a :class:`policies.cycle.Reserver`: what the first blocked job gets
             (EASY's reservation, or strict order) and how later jobs may pass it
evict        a list of :class:`policies.cycle.Evictor`: class preemption and quota reclaim,
             scavenger eviction, defragmentation moves, relief, in the configured order
burst        ``fn(cycle) -> None``: rent cloud capacity (``sla``, baselines, ``none``)
budget       ``fn(cycle) -> None``: keep the burst phase's launches within the teams' caps
             (``caps``, ``none``; policies/burst/budget.py)
defer        ``fn(cycle) -> None``: hold deferrable work for a better window (``none`` today)
estimate     ``fn(snapshot) -> Callable[[Job], float]``: a job's expected runtime
===========  ==========================================================================

A policy declares its settings and their defaults where it registers
(``register(role, name, settings={...})``); a configuration's ``policy_settings`` (or a cluster
file's ``settings``) holds them under the policy's name, and :mod:`policies.settings` checks
them against the declarations.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from types import CodeType, MappingProxyType, TracebackType
from typing import Any, TypeVar

F = TypeVar("F")

ROLES = ("order", "admit", "place", "reserve", "evict", "burst", "budget", "defer",
         "estimate")
_REGISTRY: dict[str, dict[str, Any]] = {role: {} for role in ROLES}
_SETTINGS: dict[str, Mapping[str, Any]] = {}  # policy name -> its settings' defaults


def register(role: str, name: str, settings: Mapping[str, Any] | None = None
             ) -> Callable[[F], F]:
    """Decorator: make ``obj`` (a function, or a class instantiated once) selectable as
    ``name`` for ``role``, with ``settings`` (name -> default) read from the configuration
    under ``name``."""
    if role not in _REGISTRY:
        raise ValueError(f"unknown policy role {role!r}; roles: {', '.join(ROLES)}")

    def deco(obj: F) -> F:
        _REGISTRY[role][name] = obj() if isinstance(obj, type) else obj
        _codes.cache_clear()
        if settings:
            other = _SETTINGS.get(name)
            if other is not None and dict(other) != dict(settings):
                raise ValueError(f"policy name {name!r} declares two sets of settings")
            _SETTINGS[name] = MappingProxyType(dict(settings))
        return obj

    return deco


def declare_settings(name: str, settings: Mapping[str, Any]) -> None:
    """Settings read under ``name`` by a part several policies share (``objective``: the
    weights of policies/carbon/objective.py), checked like a policy's."""
    _SETTINGS[name] = MappingProxyType(dict(settings))


def lookup(role: str, name: str) -> Any:
    try:
        return _REGISTRY[role][name]
    except KeyError:
        known = ", ".join(sorted(_REGISTRY.get(role, {}))) or "none"
        raise ValueError(f"no {role} policy named {name!r}; registered: {known}") from None


def registered(role: str) -> tuple[str, ...]:
    """The names registered for ``role``."""
    return tuple(sorted(_REGISTRY[role]))


def declared_settings() -> dict[str, Mapping[str, Any]]:
    """Policy name -> its settings' defaults, for every registered policy that has settings."""
    return dict(_SETTINGS)


def settings_of(all_settings: Mapping[str, Any], name: str) -> dict[str, Any]:
    """A policy's settings: its declared defaults, overridden by the configuration's."""
    return {**_SETTINGS.get(name, {}), **all_settings.get(name, {})}


@dataclass(frozen=True)
class PolicySet:
    """One policy per role, by name (``evict``: a list, applied in order), and a bundle name.

    ``reserve``: ``strict`` (the first blocked job blocks every later one: strict order) or
    ``easy`` (EASY backfill: the first blocked job gets a reservation; later jobs start only if
    they do not delay it). ``evict``: any of ``scavenge`` (let checkpointable preemptible jobs
    use a reservation's idle GPUs, evicted when it is due), ``priority`` (class preemption and
    quota reclaim), ``move`` (defragmentation: move small checkpointable jobs to make whole
    nodes for the reservation holder) and ``relief`` (a starved short holder evicts long
    checkpointable jobs). ``estimate``: runtimes from the time ``limit`` or the ``predictor``.
    """

    order: str = "priority-fifo"
    admit: str = "admit-all"
    place: str = "best-fit"
    reserve: str = "easy"
    evict: tuple[str, ...] = ("priority",)
    burst: str = "none"
    budget: str = "caps"  # (no budget set: it changes nothing)
    defer: str = "none"
    estimate: str = "limit"
    name: str = "custom"

    def __post_init__(self) -> None:
        if isinstance(self.evict, str):
            object.__setattr__(self, "evict", (self.evict,) if self.evict else ())
        object.__setattr__(self, "evict", tuple(self.evict))

    def check(self) -> PolicySet:
        """Itself, or ValueError naming the first policy that is not registered."""
        for role in ROLES:
            for name in self.names(role):
                lookup(role, name)
        return self

    def names(self, role: str) -> tuple[str, ...]:
        value = getattr(self, role)
        return tuple(value) if isinstance(value, tuple) else (value,)

    def resolve(self, role: str) -> Any:
        """The policy playing ``role`` (for ``evict``: the list of evictors, in order)."""
        if role == "evict":
            return tuple(lookup(role, n) for n in self.evict)
        return lookup(role, getattr(self, role))

    @classmethod
    def named(cls, name: str) -> PolicySet:
        try:
            return BUNDLES[name]
        except KeyError:
            raise ValueError(f"no policy named {name!r}; known: {', '.join(sorted(BUNDLES))}"
                             ) from None

    @classmethod
    def from_mapping(cls, name: str, raw: Mapping[str, Any]) -> PolicySet:
        """A bundle built in a configuration or cluster file: ``{order: spillway, evict:
        [priority, relief], ...}``; roles not given take the defaults above."""
        unknown = sorted(set(raw) - set(ROLES))
        if unknown:
            raise ValueError(f"policy {name!r}: {unknown[0]!r} is not a role; allowed: "
                             f"{', '.join(ROLES)}")
        kw: dict[str, Any] = {}
        for role, value in raw.items():
            if role == "evict":
                if isinstance(value, str) or not isinstance(value, (list, tuple)):
                    raise ValueError(f"policy {name!r}: evict must be a list of names, e.g. "
                                     f"[priority, relief]; registered: "
                                     f"{', '.join(registered('evict'))}")
                kw[role] = tuple(str(v) for v in value)
            elif not isinstance(value, str):
                raise ValueError(f"policy {name!r}: {role} must be a name; registered: "
                                 f"{', '.join(registered(role))}")
            else:
                kw[role] = value
        return cls(name=name, **kw).check()


def policy_at(tb: TracebackType | None, policies: PolicySet,
              extra: Mapping[CodeType, tuple[str, str]] | None = None
              ) -> tuple[str, str] | None:
    """(role, name) of the innermost policy of ``policies`` whose code is among a traceback's
    frames (a registered function, a method of a registered policy's class, or code ``extra``
    names), None if none is: which of the policies the cycle called raised an exception."""
    codes = _codes(policies)
    if extra:
        codes = {**codes, **extra}
    found = None
    while tb is not None:
        found = codes.get(tb.tb_frame.f_code, found)
        tb = tb.tb_next
    return found


def code_of(fn: object) -> CodeType | None:
    """The code of a function or a bound method (None for anything else)."""
    code = getattr(getattr(fn, "__func__", fn), "__code__", None)
    return code if isinstance(code, CodeType) else None


@lru_cache(maxsize=64)
def _codes(policies: PolicySet) -> dict[CodeType, tuple[str, str]]:
    """Code object -> (role, name), for the code of each policy ``policies`` names (code two
    of them share, such as a base class's, is left out: it names neither)."""
    seen: dict[CodeType, set[tuple[str, str]]] = {}
    for role in ROLES:
        for name in policies.names(role):
            obj = lookup(role, name)
            fns = [obj] if code_of(obj) is not None \
                else [f for cls in type(obj).__mro__[:-1] for f in vars(cls).values()]
            for fn in fns:
                code = code_of(fn)
                if code is not None:
                    seen.setdefault(code, set()).add((role, name))
    return {code: next(iter(who)) for code, who in seen.items() if len(who) == 1}


def bundle(name: str, custom: Mapping[str, PolicySet] | None = None) -> PolicySet:
    """The bundle called ``name``: one built in a configuration or cluster file (``custom``),
    else a built-in one; ValueError naming both kinds otherwise."""
    if custom and name in custom:
        return custom[name]
    if name in BUNDLES:
        return BUNDLES[name]
    known = sorted({*BUNDLES, *(custom or {})})
    raise ValueError(f"no policy named {name!r}; known: {', '.join(known)}")


BUNDLES: dict[str, PolicySet] = {
    # strict first come, first served: no classes, no backfill, no preemption
    "fcfs": PolicySet(order="fifo", reserve="strict", evict=(), name="fcfs"),
    # Slurm's multifactor priority (age, fair share, size) + EASY backfill on the user limits
    "slurm-like": PolicySet(order="multifactor", reserve="easy", evict=(), estimate="limit",
                            name="slurm-like"),
    # expected-slowdown order with fair share, held reservations, predicted runtimes,
    # scavenging, class preemption and quota reclaim, defragmentation and relief
    # ... and, where the snapshot has cloud offers, bursting what would break its SLA to the
    # offer that finishes it cheapest (policies/burst/sla.py; nothing changes on-prem)
    "spillway": PolicySet(order="spillway", place="aligned", reserve="easy",
                          evict=("scavenge", "priority", "move", "relief"),
                          burst="sla", estimate="predictor", name="spillway"),
}
# the burst decisions of today's tools, on spillway's on-prem parts (policies/burst/baselines.py)
for _name, _burst in (("burst-immediate", "immediate"), ("burst-timer", "timer"),
                      ("cloud-cheapest", "cloud-cheapest")):
    BUNDLES[_name] = PolicySet(order="spillway", place="aligned", reserve="easy",
                               evict=("scavenge", "priority", "move", "relief"),
                               burst=_burst, estimate="predictor", name=_name)
