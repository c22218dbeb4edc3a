"""The configuration's priority classes and teams: the shipped classes
(:data:`DEFAULT_CLASSES`), and the ``classes:`` and ``teams:`` lists of a configuration file
(or a simulator cluster file) checked and made into the model's :class:`PriorityClass` and
:class:`Team`, with one line per problem naming where it is.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import fields
from typing import Any, TypeGuard

from broker.config.keys import check_keys
from broker.errors import ConfigError
from broker.model import PriorityClass, Team, parse_duration
from broker.model.classes import ROLES

__all__ = ["CLASS_KEYS", "DEFAULT_CLASSES", "TEAM_KEYS", "check_access", "is_number", "is_whole",
           "parse_classes", "parse_teams"]


DEFAULT_CLASSES: tuple[PriorityClass, ...] = (
    PriorityClass("critical", 400, 5 * 60, may_preempt=True, preemptible=False, spot_allowed=False,
                  allowed_roles=("operator", "admin")),
    PriorityClass("high", 300, 30 * 60, may_preempt=True, preemptible=False),
    PriorityClass("normal", 200, 4 * 3600, preemptible=True),
    PriorityClass("low", 100, 24 * 3600, preemptible=True, may_burst=False),
)

CLASS_KEYS = tuple(f.name for f in fields(PriorityClass))
TEAM_KEYS = tuple(f.name for f in fields(Team))


def is_whole(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value))


def _entries(raw: list[Any], keys: tuple[str, ...], where: str
             ) -> Iterator[tuple[str, Mapping[str, Any], str]]:
    """Each entry of a list of named mappings (classes, teams): (where it is, the entry, its
    name), once it is a mapping of known keys with a non-empty name."""
    for i, item in enumerate(raw):
        at = f"{where}[{i}]"
        if not isinstance(item, Mapping):
            raise ConfigError(f"{at}: must be a mapping with {', '.join(keys)}")
        check_keys(item, keys, at)
        name = item.get("name")
        if not isinstance(name, str) or not name.strip():
            raise ConfigError(f"{at}.name: {name!r} must be a non-empty string")
        yield at, item, name


def parse_classes(raw: Any, where: str = "config classes") -> tuple[PriorityClass, ...]:
    if not isinstance(raw, list) or not raw:
        raise ConfigError(f"{where}: must be a non-empty list of {{name, rank, sla_s, ...}}")
    out: list[PriorityClass] = []
    for at, item, name in _entries(raw, CLASS_KEYS, where):
        if any(c.name == name for c in out):
            raise ConfigError(f"{at}.name: {name!r} repeats an earlier class; names must be "
                              "unique")
        rank = item.get("rank")
        if not is_whole(rank):
            raise ConfigError(f"{at}.rank: {rank!r} must be a whole number (higher runs first)")
        sla = item.get("sla_s", 3600.0)
        try:
            sla_s = parse_duration(sla) if isinstance(sla, (str, int, float)) else -1.0
        except ValueError:
            sla_s = -1.0
        if isinstance(sla, bool) or not sla_s > 0:
            raise ConfigError(f"{at}.sla_s: {sla!r} is not allowed; use seconds > 0 or a "
                              "duration such as 30m or 4h")
        flags: dict[str, bool] = {}
        for key in ("may_preempt", "preemptible", "may_burst", "spot_allowed", "flexible"):
            if key in item:
                if not isinstance(item[key], bool):
                    raise ConfigError(f"{at}.{key}: {item[key]!r} must be true or false")
                flags[key] = item[key]
        roles, teams = _access(item, name, at)
        out.append(PriorityClass(name=name, rank=rank, sla_s=float(sla_s), **flags,
                                 allowed_roles=roles, allowed_teams=teams))
    return tuple(out)


def _names(raw: Any, at: str, what: str, allowed: tuple[str, ...] | None = None
           ) -> tuple[str, ...]:
    """A list of names (roles, teams) of a class's ``allowed_*`` key."""
    if isinstance(raw, str):
        raw = [raw]
    if not isinstance(raw, list) or not all(isinstance(v, str) and v.strip() for v in raw):
        raise ConfigError(f"{at}: {raw!r} must be a list of {what}")
    bad = [v for v in raw if allowed is not None and v not in allowed]
    if bad:
        raise ConfigError(f"{at}: {bad[0]!r} is not a role; allowed: {', '.join(allowed or ())}")
    return tuple(dict.fromkeys(v.strip() for v in raw))


def _access(item: Mapping[str, Any], name: str, at: str
            ) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Who may submit a class: its ``allowed_roles`` and ``allowed_teams`` (both empty: all).
    A class that gives neither key keeps the shipped class of its name's (``critical``: roles
    operator and admin), else it is open to all."""
    if "allowed_roles" not in item and "allowed_teams" not in item:
        shipped = next((c for c in DEFAULT_CLASSES if c.name == name), None)
        return ((), ()) if shipped is None else (shipped.allowed_roles, shipped.allowed_teams)
    return (_names(item.get("allowed_roles", []), f"{at}.allowed_roles", "roles", ROLES),
            _names(item.get("allowed_teams", []), f"{at}.allowed_teams", "team names"))


def parse_teams(raw: Any, where: str = "config teams") -> tuple[Team, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise ConfigError(f"{where}: must be a list of {{name, weight, quota_gpus, "
                          "class_caps}}")
    out: list[Team] = []
    for at, item, name in _entries(raw, TEAM_KEYS, where):
        if any(t.name == name for t in out):
            raise ConfigError(f"{at}.name: team {name!r} is listed twice; names must be unique")
        weight = item.get("weight", 1.0)
        if not is_number(weight) or weight <= 0:
            raise ConfigError(f"{at}.weight: {weight!r} is not allowed; use a number > 0")
        quota = item.get("quota_gpus", 0)
        if not is_whole(quota) or quota < 0:
            raise ConfigError(f"{at}.quota_gpus: {quota!r} is not allowed; use a whole number "
                              ">= 0")
        out.append(Team(name=name, weight=float(weight), quota_gpus=quota,
                        class_caps=_caps(item.get("class_caps"), f"{at}.class_caps")))
    return tuple(out)


def _caps(raw: Any, at: str) -> tuple[tuple[str, int], ...]:
    """A team's ``class_caps``: {class name: the most GPUs held at once in it}. (Whether each
    class exists is checked against the classes by :func:`load_config`.)"""
    if raw is None:
        return ()
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{at}: {raw!r} must be a mapping of class name to GPUs, e.g. "
                          "{high: 16}")
    out = []
    for cls, gpus in raw.items():
        if not is_whole(gpus) or gpus < 0:
            raise ConfigError(f"{at}.{cls}: {gpus!r} is not allowed; use a whole number of "
                              "GPUs >= 0")
        out.append((str(cls), gpus))
    return tuple(out)


def check_access(classes: tuple[PriorityClass, ...], teams: tuple[Team, ...],
                 where: str = "config") -> None:
    """ConfigError where a team caps a class that does not exist."""
    names = {c.name for c in classes}
    for team in teams:
        for cls, _ in team.class_caps:
            if cls not in names:
                raise ConfigError(f"{where} teams[{team.name}].class_caps: {cls!r} is not a "
                                  f"class; allowed: {', '.join(c.name for c in classes)}")
