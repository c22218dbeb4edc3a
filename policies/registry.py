"""Policy registry: each role has one signature; configuration picks an implementation by name."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])

ROLES = ("order", "admit", "place")
_REGISTRY: dict[str, dict[str, Callable[..., Any]]] = {role: {} for role in ROLES}


def register(role: str, name: str) -> Callable[[F], F]:
    """Decorator: make ``fn`` selectable as ``name`` for ``role``."""
    if role not in _REGISTRY:
        raise ValueError(f"unknown policy role {role!r}; roles: {', '.join(ROLES)}")

    def deco(fn: F) -> F:
        _REGISTRY[role][name] = fn
        return fn

    return deco


def lookup(role: str, name: str) -> Callable[..., Any]:
    try:
        return _REGISTRY[role][name]
    except KeyError:
        known = ", ".join(sorted(_REGISTRY.get(role, {}))) or "none"
        raise ValueError(f"no {role} policy named {name!r}; registered: {known}") from None


@dataclass(frozen=True)
class PolicySet:
    """One implementation per role, by name."""

    order: str = "priority-fifo"
    admit: str = "admit-all"
    place: str = "best-fit"

    def resolve(self, role: str) -> Callable[..., Any]:
        return lookup(role, getattr(self, role))
