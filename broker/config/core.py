"""Configuration: priority classes, timings and the Redis URL. It loads and checks only.

Read from a YAML file (``--config``, ``SPILLWAY_CONFIG`` or ``~/.config/spillway/config.yaml``)
and then from ``SPILLWAY_*`` environment variables, which win (:func:`load_config`, here). The
:class:`Config` and its defaults are in :mod:`broker.config.fields`, the check of its scalar
keys in :mod:`broker.config.check`, the classes and teams in :mod:`broker.config.classes`;
their public names are re-exported here. The vocabulary it fills in (:class:`PriorityClass`,
:class:`Team`) lives in :mod:`broker.model`; it is re-exported here too.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from broker.config.check import _SCALARS, CONFIG_KEYS, _check, _misspelt
from broker.config.classes import (
    CLASS_KEYS,
    DEFAULT_CLASSES,
    TEAM_KEYS,
    check_access,
    is_number,
    is_whole,
    parse_classes,
    parse_teams,
)
from broker.config.fields import CLUSTER_CONFIG_KEYS, Config
from broker.errors import ConfigError
from broker.model import PriorityClass, Team

__all__ = [  # PriorityClass and Team are re-exported: callers import them from here too, as
    # they import the classes' and the check's names (broker/config/classes.py, check.py)
    "CLASS_KEYS",
    "CLUSTER_CONFIG_KEYS",
    "CONFIG_KEYS",
    "DEFAULT_CLASSES",
    "TEAM_KEYS",
    "Config",
    "PriorityClass",
    "Team",
    "check_access",
    "is_number",
    "is_whole",
    "load_config",
    "parse_classes",
    "parse_teams",
]


def _blank(key: str, value: Any) -> Any:
    """An empty redis_url is none (the embedded server); an empty providers: none."""
    if key == "redis_url" and value == "":
        return None
    return {} if key in ("providers", "job_users") and value is None else value


def _replace(cfg: Config, **changes: Any) -> Config:
    """``dataclasses.replace``, leaving the deferred fields (:class:`_Deferred`) that were
    never read unmade: replace reads every field it is not given."""
    unmade: dict[str, Any] = {f: None for f in ("energy", "carbon")
                              if f not in changes and cfg.__dict__.get(f) is None}
    return replace(cfg, **changes, **unmade)


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
        import yaml

        p = Path(path).expanduser()
        try:
            data = yaml.safe_load(p.read_text()) or {}
        except OSError as e:
            raise ConfigError(f"cannot read config file {p}: {e.strerror}") from None
        except yaml.YAMLError as e:
            raise ConfigError(f"config file {p} is not valid YAML: {e}") from None
        if not isinstance(data, dict):
            raise ConfigError(f"config file {p}: top level must be a mapping")
        data = {str(k): _blank(str(k), v) for k, v in data.items()}
        changes = _check(data, env=False)
        if "classes" in changes:
            changes["classes"] = parse_classes(changes["classes"])
        if "teams" in changes:
            changes["teams"] = parse_teams(changes["teams"])
        if "providers" in changes:
            from broker.config.providers import parse_providers

            changes["providers"] = parse_providers(changes["providers"])
        if "job_users" in changes:
            changes["job_users"] = {str(k): str(v) for k, v in changes["job_users"].items()}
        if "energy" in changes or "carbon" in changes:
            from broker.config.energy import parse_carbon, parse_energy

            if "energy" in changes:
                changes["energy"] = parse_energy(changes["energy"])
            if "carbon" in changes:
                changes["carbon"] = parse_carbon(changes["carbon"])
        cfg = _replace(cfg, **changes)
        if "policy_settings" in changes and not isinstance(cfg.policy_settings, Mapping):
            raise ConfigError("config policy_settings: must be a mapping of policy name to its "
                              "settings, e.g. {spillway: {fairshare_tier: 0.9}}")
    variables = {f"SPILLWAY_{key.upper()}": key for key in _SCALARS}
    given = {variables[var]: _blank(variables[var], value)
             for var, value in env.items() if var in variables}
    unknown = [var for var in env if var not in variables and _misspelt(var)]
    if given or unknown:
        cfg = _replace(cfg, **_check(given | {v: env[v] for v in unknown}, env=True))
    clean = {k: v for k, v in overrides.items() if v is not None}
    if clean:
        cfg = _replace(cfg, **clean)
    if cfg.priority(cfg.default_class) is None:
        raise ConfigError(
            f"config default_class: {cfg.default_class!r} is not one of {list(cfg.class_names)}"
        )
    if cfg.lease_ttl_s <= cfg.heartbeat_s:
        raise ConfigError("config lease_ttl_s must be longer than heartbeat_s")
    check_access(cfg.classes, cfg.teams)
    return cfg
