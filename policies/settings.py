"""Policy settings: what a cluster file's ``settings`` (the simulator) or the configuration's
``policy_settings`` may hold, checked when it is loaded.

::

    settings:                            # each under the name of the policy that reads it
      spillway: {fairshare_tier: 0.95, class_weight: {normal: 2, low: 1}}  # spillway's order
                                           # (policies/order/orderings.py SPILLWAY_DEFAULTS)
      multifactor: {weight_fairshare: 10000}  # the slurm-like order (SLURM_DEFAULTS)
      easy: {backfill_relax: 0.0}          # EASY backfill (policies/place/backfill.py)
      move: {defrag_min_gain_s: 600}       # defragmentation moves (policies/evict/defrag.py)
      relief: {relief_slowdown: 20, relief_ratio: 10, min_gain_s: 600, min_estimate_s: 60}
      predictor_quantile: 0.9              # the runtime predictor's quantile for backfill
      fairshare_half_life_s: 604800        # a cluster file only: these three override the
      min_runtime_s: 600                   # configuration's values of the same names
      grace_s: 30

A key that is not known, or a value of the wrong kind, raises
:class:`~broker.errors.ConfigError` naming the key, what was wrong and what is allowed: a
misspelt knob would otherwise be ignored without a word.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from broker.config.core import CLUSTER_CONFIG_KEYS, Config
from broker.errors import ConfigError
from policies.registry import BUNDLES, ROLES, PolicySet, declared_settings

#: Configuration values a cluster file may override (the simulator applies them to its Config).
CONFIG_KEYS = CLUSTER_CONFIG_KEYS
#: Values that are a share in (0, 1].
QUANTILES = ("order_quantile", "predictor_quantile")
#: Values that must be above zero (they divide).
POSITIVE = ("max_age_s", "min_estimate_s")


def is_number(value: Any) -> bool:
    """A real number (not a bool)."""
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value))


def _sections() -> dict[str, Mapping[str, Any]]:
    """Policy name -> the settings it declares, with their defaults (policies/registry.py)."""
    return declared_settings()


def _number(value: Any, where: str, *, share: bool = False, positive: bool = False) -> float:
    ok = is_number(value)
    if share:
        if not ok or not 0 < value <= 1:
            raise ConfigError(f"{where}: {value!r} is not allowed; allowed: a number in (0, 1]")
    elif not ok or value < 0 or (positive and value == 0):
        kind = "a number > 0" if positive else "a number >= 0"
        raise ConfigError(f"{where}: {value!r} is not allowed; allowed: {kind}")
    return float(value)


def check_settings(settings: Mapping[str, Any], where: str, *,
                   classes: Iterable[str] = (), cluster: bool = False) -> dict[str, Any]:
    """``settings`` as a plain dict, or :class:`ConfigError` for the first thing wrong in it.
    ``classes``: the class names the settings may name (empty: any); ``cluster``: the
    settings of a cluster file, which may also hold :data:`CONFIG_KEYS`."""
    names = tuple(classes)
    sections = _sections()
    top = [*sections, "predictor_quantile", *(CONFIG_KEYS if cluster else ())]
    if not isinstance(settings, Mapping):
        raise ConfigError(f"{where}: must be a mapping; allowed keys: {top}")
    for key, value in settings.items():
        at = f"{where}.{key}"
        if key in CONFIG_KEYS and cluster:
            _number(value, at, positive=key != "grace_s")
        elif key == "predictor_quantile":
            _number(value, at, share=True)
        elif key in sections:
            known = sections[key]
            if not isinstance(value, Mapping):
                raise ConfigError(f"{at}: must be a mapping; allowed keys: {sorted(known)}")
            for k, v in value.items():
                if k not in known:
                    raise ConfigError(f"{at}: {k!r} is not a setting of {key!r}; allowed: "
                                      f"{sorted(known)}")
                _check_value(k, v, f"{at}.{k}", names)
        else:
            raise ConfigError(f"{where}: {key!r} is not a setting; allowed: {top}")
    return dict(settings)


def _check_value(key: str, value: Any, at: str, classes: tuple[str, ...]) -> None:
    if key == "class_weight":
        if not isinstance(value, Mapping):
            raise ConfigError(f"{at}: must be a mapping of class name to weight, e.g. "
                              "{normal: 2, low: 1}")
        for name, w in value.items():
            if classes and name not in classes:
                raise ConfigError(f"{at}: {name!r} is not a class; allowed: {list(classes)}")
            _number(w, f"{at}.{name}")
    else:
        _number(value, at, share=key in QUANTILES, positive=key in POSITIVE)


def check_bundles(raw: Any, where: str) -> dict[str, PolicySet]:
    """Bundles built in a configuration or cluster file, by name::

        policies:
          backfill-only: {order: multifactor, reserve: easy, evict: []}
          mine: {order: spillway, place: aligned, evict: [priority, relief],
                 estimate: predictor}

    Each role not given takes PolicySet's default; a built-in bundle's name may not be reused.
    :class:`ConfigError` names the first thing wrong."""
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where}: must be a mapping of a bundle's name to its roles, e.g. "
                          "{mine: {order: spillway, evict: [priority]}}")
    out: dict[str, PolicySet] = {}
    for name, roles in raw.items():
        if name in BUNDLES:
            raise ConfigError(f"{where}.{name}: a built-in bundle's name; choose another")
        if not isinstance(roles, Mapping):
            raise ConfigError(f"{where}.{name}: must be a mapping of role to policy name; "
                              f"roles: {', '.join(ROLES)}")
        try:
            out[str(name)] = PolicySet.from_mapping(str(name), roles)
        except ValueError as e:
            raise ConfigError(f"{where}.{name}: {e}") from None
    return out


def check_config(cfg: Config, where: str = "config") -> Config:
    """``cfg`` if its bundles build, its policy bundle is known and its ``policy_settings``
    are settings of registered policies, else :class:`ConfigError` naming the first thing
    wrong."""
    custom = check_bundles(cfg.policies, f"{where} policies")
    if cfg.policy not in BUNDLES and cfg.policy not in custom:
        raise ConfigError(f"{where} policy: {cfg.policy!r} is not one of "
                          f"{sorted({*BUNDLES, *custom})}")
    check_settings(cfg.policy_settings, f"{where} policy_settings", classes=cfg.class_names)
    return cfg
