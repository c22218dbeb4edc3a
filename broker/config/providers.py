"""The ``providers:`` section of the configuration, checked when the configuration loads.

Each entry names one provider (its key is the first part of its sites' ids, e.g. ``local`` in
``local:home:home-a:ondemand``) and holds Spillway's settings for it (below, with defaults)
beside the provider's own options (regions, credentials profile, ...). The provider itself is
built only where the provisioner runs (:func:`providers.base.make_provider`); here its kind and
the names of its options are checked, so a typo is reported at load, naming the provider and
the key, with the closest known key.
"""

from __future__ import annotations

import importlib
import inspect
import math
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from broker.config.keys import key_hint
from broker.errors import ConfigError

_NAME = re.compile(r"[a-z0-9][a-z0-9_-]*")


@dataclass(frozen=True)
class ProviderSettings:
    """Spillway's settings for one configured provider; ``options`` go to the provider."""

    name: str
    kind: str
    boot_timeout_s: float = 600.0  # an agent not registered this long after launch: reaped
    boot_s: float | None = None  # its machines' boot (launch to a registered agent) before
    # one was seen (None: its kind's default, broker/store/boots.py: local 5 s, clouds 240 s);
    # each machine that boots then teaches its offer's estimate
    idle_timeout_s: float = 300.0  # a READY cloud node idle this long is drained and released
    cooldown_s: float = 900.0  # a zone is not tried this long after a capacity failure, a
    # boot timeout or a spot notice
    max_instances: int = 8  # live instances of this provider at most
    broker_url: str = ""  # the Redis URL its agents join ("": the provisioner's server, with
    # a user made for each machine when its URL has credentials: broker/security/cloud_agent)
    registrar_wait_s: float = 10.0  # the provisioner waits this long for `spillway
    # registrar` to make a machine's user (each of two steps); none answers: the launch fails
    install_command: str | None = None  # run first by a new machine (None: per kind)
    worker_command: str | None = None  # how a new machine runs Spillway (None: per kind)
    options: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "options", MappingProxyType(dict(self.options)))

    @property
    def install(self) -> str:
        if self.install_command is not None:
            return self.install_command
        return "" if self.kind == "local" else "python3 -m pip install --quiet spillway"

    @property
    def worker(self) -> str:
        if self.worker_command is not None:
            return self.worker_command
        return f"{sys.executable} -m broker.cli" if self.kind == "local" else "spillway"

    def provider_settings(self) -> dict[str, Any]:
        """What :func:`providers.base.make_provider` takes: the kind and the options."""
        return {"kind": self.kind, **self.options}


_COMMON: dict[str, tuple[str, str]] = {  # key: (type, what is allowed)
    "boot_timeout_s": ("seconds", "seconds > 0"),
    "boot_s": ("seconds", "seconds > 0"),
    "idle_timeout_s": ("seconds", "seconds > 0"),
    "cooldown_s": ("seconds0", "seconds >= 0"),
    "max_instances": ("whole", "a whole number >= 1"),
    "broker_url": ("url", "a redis://, rediss:// or unix:// URL agents can reach"),
    "registrar_wait_s": ("seconds", "seconds > 0"),
    "install_command": ("text", "a shell command"),
    "worker_command": ("text", "a shell command that runs spillway"),
}
COMMON_KEYS = ("kind", *_COMMON)


def _value(name: str, key: str, value: Any) -> Any:
    kind, allowed = _COMMON[key]
    where = f"config providers.{name}.{key}"
    bad = ConfigError(f"{where}: {value!r} is not allowed; use {allowed}")
    if kind in ("seconds", "seconds0"):
        if isinstance(value, bool) or not isinstance(value, (int, float)) \
                or not math.isfinite(value) or value < 0 or (kind == "seconds" and value == 0):
            raise bad
        return float(value)
    if kind == "whole":
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise bad
        return value
    if not isinstance(value, str):
        raise bad
    if kind == "url" and value and not value.startswith(("redis://", "rediss://", "unix://")):
        raise bad
    return value


def _option_names(kind: str) -> tuple[str, ...] | None:
    """The keyword options a provider kind's class takes; None if its module cannot be read
    here (then the provisioner reports a wrong key when it builds the provider)."""
    from providers.base import KINDS

    module_name, cls_name = KINDS[kind][0].split(":")
    try:
        cls = getattr(importlib.import_module(module_name), cls_name)
        params = inspect.signature(cls.__init__).parameters.values()
    except (ImportError, AttributeError, ValueError, TypeError):
        return None
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return None
    return tuple(p.name for p in params if p.name not in ("self", "name", "cluster"))


def parse_provider(name: str, raw: Any) -> ProviderSettings:
    from providers.base import KINDS

    where = f"config providers.{name}"
    if not _NAME.fullmatch(name):
        raise ConfigError(f"{where}: the name {name!r} must be lower-case letters, digits, "
                          "'-' or '_' (it is the first part of the provider's site ids)")
    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where}: must be a mapping of settings, e.g. "
                          "{kind: aws, regions: [us-east-1]}")
    kind = raw.get("kind", name)
    if kind not in KINDS:
        raise ConfigError(f"{where}.kind: {kind!r} is not one of {', '.join(sorted(KINDS))}"
                          + ("" if "kind" in raw else " (the kind defaults to the name; set "
                             "kind: for a provider with another name)"))
    common = {k: _value(name, k, v) for k, v in raw.items() if k in _COMMON}
    options = {str(k): v for k, v in raw.items() if k not in COMMON_KEYS}
    known = _option_names(kind)
    if known is not None:
        for key in options:
            if key not in known:
                hint = key_hint(key, [*COMMON_KEYS, *known])
                raise ConfigError(f"{where}.{key}: not a setting of a {kind} provider; {hint}")
    return ProviderSettings(name=name, kind=kind, options=options, **common)


def parse_providers(raw: Any) -> Mapping[str, ProviderSettings]:
    """The ``providers:`` mapping checked: name -> ProviderSettings; ConfigError naming the
    provider and the key otherwise."""
    if raw is None:
        return MappingProxyType({})
    if not isinstance(raw, Mapping):
        raise ConfigError(f"config providers: {raw!r} is not a mapping; use {{provider name: "
                          "its settings}}")
    return MappingProxyType({str(k): parse_provider(str(k), v) for k, v in raw.items()})
