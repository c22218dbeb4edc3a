"""The check of a configuration's scalar keys, from its file or its ``SPILLWAY_*`` variables:
each key's type and range (:data:`_RULES`, checked by a pydantic model built at the first
check), and one line per problem naming the key as the user wrote it and what is allowed (an
unknown key: the closest known one).
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import MISSING, fields
from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    create_model,
    field_validator,
)

from broker.config.fields import Config
from broker.config.keys import key_hint
from broker.errors import ConfigError

__all__ = ["CONFIG_KEYS"]

#: Every scalar key: its type and range for pydantic, and what is allowed, in words.
_RULES: dict[str, tuple[type, dict[str, Any], str]] = {
    "redis_url": (str, {}, "a redis://, rediss:// or unix:// URL"),
    "heartbeat_s": (float, {"gt": 0}, "seconds > 0"),
    "lease_ttl_s": (float, {"gt": 0}, "seconds > 0"),
    "reconcile_s": (float, {"gt": 0}, "seconds > 0"),
    "cycle_s": (float, {"gt": 0}, "seconds > 0"),
    "cycle_gap_s": (float, {"ge": 0}, "seconds >= 0"),
    "leader_lease_s": (float, {"gt": 0}, "seconds > 0"),
    "redis_retry_s": (float, {"ge": 0}, "seconds >= 0 (0: wait forever)"),
    "metrics_port": (int, {"ge": 0, "le": 65535}, "a port 0..65535 (0: none)"),
    "agent_metrics_port": (int, {"ge": 0, "le": 65535}, "a port 0..65535 (0: none)"),
    "metrics_token": (str, {}, "a bearer token (empty: none)"),
    "metrics_basic_auth": (str, {}, "user:password (empty: none)"),
    "metrics_tls_cert": (str, {}, "a PEM certificate file (empty: plain HTTP)"),
    "metrics_tls_key": (str, {}, "its PEM private key file (empty: plain HTTP)"),
    "grace_s": (float, {"ge": 0}, "seconds >= 0"),
    "job_pids_max": (int, {"ge": 1}, "a whole number >= 1"),
    "max_attempts": (int, {"ge": 1}, "a whole number >= 1"),
    "retain_finished_s": (float, {"ge": 0}, "seconds >= 0 (0: keep every job hot)"),
    "job_user": (str, {}, "a user name (empty: a uid per team)"),
    "job_isolation": (bool, {}, "true or false"),
    "job_uid_range": (str, {"pattern": r"^\s*\d+\s*-\s*\d+\s*$"},
                      "FIRST-LAST, a range of uids such as 61184-65519"),
    "max_preemptions": (int, {"ge": 1}, "a whole number >= 1"),
    "hold_if_infeasible": (bool, {}, "true or false"),
    "node_forget_after_s": (float, {"gt": 0}, "seconds > 0, e.g. 86400 (a day)"),
    "default_class": (str, {"min_length": 1}, "a class name"),
    "default_team": (str, {"pattern": r"^[A-Za-z0-9_.-]{1,64}$"},
                     "1-64 letters, digits, '.', '_' or '-'"),
    "state_dir": (str, {"min_length": 1}, "a directory"),
    "policy": (str, {"min_length": 1}, "a policy name"),
    "fairshare_half_life_s": (float, {"gt": 0}, "seconds > 0"),
    "min_runtime_s": (float, {"ge": 0}, "seconds >= 0"),
    "max_time_limit_s": (float, {"gt": 0, "le": 10 * 365 * 86400.0},
                         "seconds > 0, at most 10 years (315360000)"),
    "onprem_price_per_gpu_hour": (float, {"ge": 0}, "dollars per GPU-hour >= 0"),
    "offer_catalog": (str, {}, "a catalog file (empty: the shipped catalog)"),
    "cluster_name": (str, {"pattern": r"^[a-z][a-z0-9_-]{0,62}$"},
                     "a lower-case letter, then lower-case letters, digits, '-' or '_' (at "
                     "most 63 characters: every cloud's tags can hold it)"),
}
_SCALARS = tuple(_RULES)
_REDIS_SCHEMES = ("redis://", "rediss://", "unix://")
#: Every key a configuration file may have, in the order they are listed.
CONFIG_KEYS = tuple(f.name for f in fields(Config) if f.name != "extra")
#: ``SPILLWAY_*`` variables that are not configuration keys (set for jobs, or read elsewhere).
_OTHER_VARS = frozenset({"SPILLWAY_CONFIG", "SPILLWAY_DEFAULTS", "SPILLWAY_AGENT",
                         "SPILLWAY_JOB_ID", "SPILLWAY_NODE_ID", "SPILLWAY_NODE_RANK",
                         "SPILLWAY_NUM_NODES", "SPILLWAY_ATTEMPT", "SPILLWAY_RESUME",
                         "SPILLWAY_CHECKPOINT_DIR", "SPILLWAY_SCRATCH_DIR",
                         "SPILLWAY_INSTANCE_ID", "SPILLWAY_METADATA_URL",
                         "SPILLWAY_CGROUP_PARENT", "SPILLWAY_REDIS_URL_FILE"})


def _misspelt(var: str) -> bool:
    """Whether a ``SPILLWAY_*`` variable that is no setting looks like one misspelt (other
    ``SPILLWAY_*`` variables, such as those set for jobs, are left alone)."""
    return (var.startswith("SPILLWAY_") and var not in _OTHER_VARS
            and bool(difflib.get_close_matches(var.removeprefix("SPILLWAY_").lower(),
                                               _SCALARS, n=1, cutoff=0.8)))


class _Checked(BaseModel):
    # (built at the first check: with no file and no SPILLWAY_* value there is none, and a
    # CLI command is spared the build)
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, frozen=True,
                              defer_build=True)

    @field_validator("*", mode="before")
    @classmethod
    def _no_bools(cls, value: Any, info: ValidationInfo) -> Any:
        if isinstance(value, bool) and _RULES.get(info.field_name or "", (None,))[0] is not bool:
            # pydantic's lax mode reads true as 1
            raise ValueError("is a boolean")
        return value

    @field_validator("redis_url", check_fields=False)
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(_REDIS_SCHEMES):
            raise ValueError("not a Redis URL")
        return value


def _definitions() -> dict[str, Any]:
    defaults = {f.name: f.default for f in fields(Config) if f.default is not MISSING}
    out: dict[str, Any] = {
        name: (kind | None if name == "redis_url" else kind, Field(defaults[name], **limits))
        for name, (kind, limits, _) in _RULES.items()}
    out["providers"] = (dict[str, Any], Field(default_factory=dict))
    out["job_users"] = (dict[str, str | int], Field(default_factory=dict))
    for name in ("classes", "teams", "policies", "policy_settings", "energy", "carbon"):
        out[name] = (Any, None)  # checked by parse_classes, parse_teams, check_config,
        # parse_energy and parse_carbon
    return out


_Model = create_model("ConfigFile", __base__=_Checked, **_definitions())

_TYPE_WORDS = {float: "a number", int: "a whole number", str: "a string",
               bool: "true or false"}


def _spelt(key: str, env: bool) -> str:
    """A key as the user writes it: ``grace_s`` in the file, ``SPILLWAY_GRACE_S`` outside."""
    return key if not env or key.startswith("SPILLWAY_") else f"SPILLWAY_{key.upper()}"


def _problem(err: Mapping[str, Any], key: str, env: bool) -> str:
    """One line for one pydantic error, naming the key (``config grace_s`` or
    ``SPILLWAY_GRACE_S``) and what is allowed; an unknown key names the closest known one."""
    name = _spelt(key, env) if env else f"config {key}"
    if err["type"] == "extra_forbidden":
        known = _SCALARS if env else CONFIG_KEYS  # (only scalars have variables)
        hint = key_hint(key.removeprefix("SPILLWAY_").lower(), known, lambda k: _spelt(k, env))
        return f"{name}: not a setting; {hint}"
    value = err.get("input")
    if key == "providers":
        return f"{name}: {value!r} is not a mapping; use {{provider name: its settings}}"
    if key == "job_users":
        return (f"{name}: {value!r} is not allowed; use a mapping of team name to a user "
                "name or uid, e.g. {vision: svc-vision, nlp: 61200}")
    kind, _, allowed = _RULES[key]
    kind_error = err["type"].endswith(("_type", "_parsing", "_from_float")) or \
        "boolean" in err.get("msg", "")
    if kind_error:
        return f"{name}: {value!r} is not {_TYPE_WORDS[kind]}; use {allowed}"
    return f"{name}: {value!r} is not allowed; use {allowed}"


def _as_given(key: str, value: Any) -> bool:
    """Whether the check would take ``value`` for ``key`` as it is: a str for a key that is
    any str, a Redis URL (or none) for ``redis_url``."""
    rule = _RULES.get(key)
    if rule is None or rule[0] is not str or rule[1]:
        return False
    if key == "redis_url":
        return value is None or (type(value) is str and value.startswith(_REDIS_SCHEMES))
    return type(value) is str


def _check(data: Mapping[str, Any], env: bool) -> dict[str, Any]:
    """The keys of ``data`` (of the file, or of the variables: ``env``) checked and converted;
    ConfigError with one line per problem. Keys whose values need neither (the usual
    ``SPILLWAY_REDIS_URL``) are taken as they are, without building the check's model."""
    if all(_as_given(k, v) for k, v in data.items()):
        return dict(data)
    try:
        model = _Model.model_validate(dict(data))
    except ValidationError as e:
        lines = []
        for err in e.errors():
            key = str(err["loc"][0]) if err["loc"] else "?"
            lines.append(_problem(err, key, env))
        raise ConfigError("\n".join(dict.fromkeys(lines))) from None
    return {k: getattr(model, k) for k in data}
