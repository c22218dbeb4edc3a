"""Policy settings: what a cluster file's ``settings`` (the simulator) or the configuration's
``policy_settings`` may hold, checked when it is loaded.

::

    settings:
      spillway: {fairshare_tier: 0.95, class_weight: {normal: 2, low: 1}}  # spillway's order
                                           # and cycle (policies/ordering.py SPILLWAY_DEFAULTS)
      slurm: {weight_fairshare: 10000}     # the multifactor order (SLURM_DEFAULTS)
      slurm-like: {backfill_relax: 0.0}    # another bundle's cycle: backfill_relax only
      predictor_quantile: 0.9              # the runtime predictor's quantile for backfill
      fairshare_half_life_s: 604800        # a cluster file only: these three override the
      min_runtime_s: 600                   # configuration's values of the same names
      grace_s: 30

A key that is not known, or a value of the wrong kind, raises
:class:`~broker.errors.ConfigError` naming the key, what was wrong and what is allowed: a
misspelt knob would otherwise be ignored without a word.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from broker.config import is_number
from broker.errors import ConfigError

#: Configuration values a cluster file may override (the simulator applies them to its Config).
CONFIG_KEYS = ("fairshare_half_life_s", "min_runtime_s", "grace_s")
#: Settings read for any bundle, under the bundle's name (broker/scheduler.py).
CYCLE_KEYS = ("backfill_relax",)
#: Values that are a share in (0, 1].
QUANTILES = ("order_quantile", "predictor_quantile")
#: Values that must be above zero (they divide).
POSITIVE = ("max_age_s", "min_estimate_s")


def _sections() -> dict[str, Mapping[str, Any]]:
    from policies.ordering import SLURM_DEFAULTS, SPILLWAY_DEFAULTS  # late: ordering imports
    from policies.registry import BUNDLES  # the broker, which imports the config

    out: dict[str, Mapping[str, Any]] = {name: {k: SPILLWAY_DEFAULTS[k] for k in CYCLE_KEYS}
                                         for name in BUNDLES}
    out["spillway"] = SPILLWAY_DEFAULTS
    out["slurm"] = SLURM_DEFAULTS
    return out


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
