"""What a user asks for: JobSpec, validated at the edge, and the Resources it needs.

JobSpec is a frozen pydantic model. Checking it against the configured priority classes reads
only what :class:`SpecDefaults` names, so this module never imports the configuration.
"""

from __future__ import annotations

import difflib
import math
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Protocol

from pydantic import (
    BaseModel,
    ConfigDict,
    ValidationError,
    field_validator,
    model_validator,
)

from broker.errors import FieldError, SpecError
from broker.model.classes import PriorityClass, Team
from broker.model.gpus import ALL_MIG_PROFILES, KNOWN_MODELS, MIG_PROFILES, normalise_type
from broker.model.values import (
    MAX_DEADLINE,
    EnvName,
    NoNul,
    no_nul,
    over_max,
    parse_duration,
    parse_time,
    shown,
)

SITES = ("onprem", "cloud", "spot")


class SpecDefaults(Protocol):
    """What checking a JobSpec reads from the configuration (``broker.config.core.Config`` has
    it)."""

    @property
    def default_class(self) -> str: ...

    @property
    def default_team(self) -> str: ...

    @property
    def class_names(self) -> tuple[str, ...]: ...

    @property
    def max_time_limit_s(self) -> float: ...

    def priority(self, name: str) -> PriorityClass | None: ...

    def team(self, name: str) -> Team: ...


@dataclass(frozen=True)
class Resources:
    """What one job needs. ``gpus`` and ``cpus``/``memory_gb`` are per node."""

    gpus: int = 1
    gpu_types: tuple[str, ...] = ()  # families (A100) or models (A100-80GB); empty: any
    min_gpu_memory_gb: float = 0.0
    mig_profile: str | None = None  # then ``gpus`` counts MIG instances of that profile
    cpus: float = 1.0
    memory_gb: float = 0.0
    nodes: int = 1

    def __hash__(self) -> int:  # cached: the cycle keys its memos by request shape
        h: int | None = self.__dict__.get("_hash")
        if h is None:
            h = hash((self.gpus, self.gpu_types, self.min_gpu_memory_gb, self.mig_profile,
                      self.cpus, self.memory_gb, self.nodes))
            object.__setattr__(self, "_hash", h)
        return h

    @cached_property
    def key(self) -> tuple[object, ...]:
        """The request as a plain tuple: a cheap dictionary key for per-shape memos."""
        return (self.gpus, self.gpu_types, self.min_gpu_memory_gb, self.mig_profile,
                self.cpus, self.memory_gb, self.nodes)

    @property
    def total_gpus(self) -> int:
        return self.gpus * self.nodes


class JobSpec(BaseModel):
    """What a user asks for. Immutable; validated on construction and again against config."""

    # (its validator is built when first used: reading stored jobs never validates, see
    # Job.from_dict, so `spillway queue` is spared the build)
    model_config = ConfigDict(frozen=True, extra="forbid", str_strip_whitespace=True,
                              defer_build=True)

    command: list[str] | str
    name: str | None = None
    env: dict[EnvName, NoNul] = {}
    workdir: NoNul | None = None
    gpus: int = 1
    gpu_types: tuple[str, ...] = ()
    min_gpu_memory_gb: float = 0.0
    mig_profile: str | None = None
    cpus: float = 1.0
    memory_gb: float = 0.0
    nodes: int = 1
    priority: str | None = None
    team: str | None = None
    time_limit: float | None = None
    deadline: float | None = None
    checkpoint_dir: NoNul | None = None
    sites: tuple[str, ...] = ("onprem", "cloud", "spot")
    max_price_per_hour: float | None = None
    labels: dict[str, str] = {}

    @field_validator("command")
    @classmethod
    def _command(cls, v: list[str] | str) -> list[str] | str:
        if isinstance(v, str):
            if not v.strip():
                raise ValueError("must not be empty")
            no_nul(v)
            try:
                shlex.split(v)
            except ValueError as e:
                raise ValueError(f"is not a valid shell command ({e})") from None
            return v
        if not v or not v[0].strip():
            raise ValueError("must be a non-empty argv list or shell string")
        for arg in v:
            no_nul(arg)
        return v

    @field_validator("gpus")
    @classmethod
    def _gpus(cls, v: int) -> int:
        if v < 0 or v > 64:
            raise ValueError(f"must be between 0 and 64 per node, got {v}")
        return v

    @field_validator("nodes")
    @classmethod
    def _nodes(cls, v: int) -> int:
        if v < 1 or v > 1024:
            raise ValueError(f"must be between 1 and 1024, got {v}")
        return v

    @field_validator("cpus", "memory_gb", "min_gpu_memory_gb")
    @classmethod
    def _non_negative(cls, v: float) -> float:
        if not math.isfinite(v) or v < 0:
            raise ValueError(f"must be a finite number, zero or more, got {v}")
        return v

    @field_validator("gpu_types", mode="before")
    @classmethod
    def _gpu_types(cls, v: Any) -> tuple[str, ...]:
        if v is None:
            return ()
        items = _items(v, "GPU types, e.g. [A100, H100] or 'A100,H100'")
        out = []
        for item in items:
            for part in str(item).split(","):
                if not part.strip():
                    continue
                norm = normalise_type(part)
                if norm is None:
                    raise ValueError(
                        f"unknown GPU type {part.strip()!r}; allowed: families "
                        "K80, P100, T4, V100, A10G, A10, L4, A40, A6000, L40S, A100, H100, "
                        f"H200, B200, RTX4090 or models {', '.join(KNOWN_MODELS)}"
                    )
                out.append(norm)
        return tuple(dict.fromkeys(out))

    @field_validator("mig_profile")
    @classmethod
    def _mig(cls, v: str | None) -> str | None:
        if v is None:
            return v
        v = v.lower()
        if v not in ALL_MIG_PROFILES:
            raise ValueError(f"unknown MIG profile {v!r}; allowed: {', '.join(ALL_MIG_PROFILES)}")
        return v

    @field_validator("time_limit", mode="before")
    @classmethod
    def _time_limit(cls, v: Any) -> float | None:
        if v is None:
            return None
        secs = parse_duration(v)
        if not math.isfinite(secs):
            raise ValueError(f"must be a finite duration, got {shown(v)}")
        if secs <= 0:
            raise ValueError(f"must be positive, got {shown(v)}")
        return secs  # (at most the configuration's max_time_limit_s: checked())

    @field_validator("deadline", mode="before")
    @classmethod
    def _deadline(cls, v: Any) -> float | None:
        if v is None:
            return None
        t = parse_time(v)
        if not (math.isfinite(t) and 0 <= t <= MAX_DEADLINE):
            raise ValueError(f"must be a time between 1970 and the end of 9999, got {shown(v)}")
        return t

    @field_validator("sites", mode="before")
    @classmethod
    def _sites(cls, v: Any) -> tuple[str, ...]:
        # (the allowed sites follow every message: _ALLOWED_HINT)
        items = _items(v or (), "sites, e.g. [onprem, cloud]")
        parts = [p.strip().lower() for item in items for p in str(item).split(",") if p.strip()]
        bad = list(dict.fromkeys(p for p in parts if p not in SITES))
        if len(bad) == 1:
            raise ValueError(f"{shown(bad[0])} is not a site")
        if bad:
            raise ValueError(f"{', '.join(shown(b) for b in bad)} are not sites")
        if not parts:
            raise ValueError("is empty; name at least one site")
        return tuple(dict.fromkeys(parts))

    @field_validator("max_price_per_hour")
    @classmethod
    def _price(cls, v: float | None) -> float | None:
        if v is not None and not (math.isfinite(v) and v > 0):
            raise ValueError(f"must be a positive, finite number of dollars per hour, got {v}")
        return v

    @model_validator(mode="after")
    def _consistent(self) -> JobSpec:
        if self.mig_profile and self.nodes > 1:
            raise ValueError("mig_profile jobs run on one node (nodes must be 1)")
        if self.mig_profile and self.gpus == 0:
            raise ValueError("mig_profile needs gpus >= 1 (the number of MIG instances)")
        if self.mig_profile and self.gpu_types:
            ok = [m for m, ps in MIG_PROFILES.items() if self.mig_profile in ps]
            if not any(m == t or m.startswith(t + "-") for m in ok for t in self.gpu_types):
                raise ValueError(
                    f"MIG profile {self.mig_profile} exists only on {', '.join(ok)}"
                )
        return self

    @property
    def resources(self) -> Resources:
        return Resources(
            gpus=self.gpus,
            gpu_types=self.gpu_types,
            min_gpu_memory_gb=self.min_gpu_memory_gb,
            mig_profile=self.mig_profile,
            cpus=self.cpus,
            memory_gb=self.memory_gb,
            nodes=self.nodes,
        )

    @property
    def argv(self) -> list[str]:
        """The command as an argv list (a shell string runs under ``/bin/sh -c``)."""
        return ["/bin/sh", "-c", self.command] if isinstance(self.command, str) else self.command

    @property
    def display_command(self) -> str:
        return self.command if isinstance(self.command, str) else shlex.join(self.command)

    @classmethod
    def parse(cls, data: Mapping[str, Any], config: SpecDefaults | None = None) -> JobSpec:
        """Validate user input; raise :class:`SpecError` naming every bad field."""
        try:
            spec = cls.model_validate(dict(data))
        except ValidationError as e:
            errors = _merged([_field_error(err) for err in e.errors()])
            if config is not None and not any(f.field == "priority" for f in errors):
                prio = data.get("priority") or config.default_class
                if config.priority(str(prio)) is None:  # report the class with the rest
                    errors.append(FieldError("priority", f"unknown priority class {prio!r}",
                                             ", ".join(config.class_names)))
            if config is not None and not any(f.field == "time_limit" for f in errors):
                try:  # (the field itself was fine: is it within the maximum?)
                    limit = cls._time_limit(data.get("time_limit"))
                except ValueError:
                    limit = None
                errors += over_max(limit, config.max_time_limit_s)
            raise SpecError(errors) from None
        return spec.checked(config) if config is not None else spec

    def checked(self, config: SpecDefaults) -> JobSpec:
        """Resolve defaults from config and check what depends on it (the class exists, the
        team's name, the time limit within the maximum, the GPUs within the team's cap for
        the class); raise SpecError naming every field that is not."""
        prio = self.priority or config.default_class
        cls = config.priority(prio)
        problems = [] if cls is not None else [
            FieldError("priority", f"unknown priority class {prio!r}",
                       ", ".join(config.class_names))]
        team = self.team or config.default_team
        if not re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", team):
            problems.append(FieldError("team", f"{team!r} is not a valid team name",
                                       "1-64 letters, digits, '.', '_' or '-'"))
        problems += over_max(self.time_limit, config.max_time_limit_s)
        cap = config.team(team).class_cap(prio) if cls is not None and not problems else None
        gpus = self.gpus * self.nodes
        if cap is not None and gpus > cap:
            problems.append(FieldError(
                "gpus", f"asks {gpus} GPU(s) in class {prio!r}, more than team {team!r} may "
                        f"hold in it at once ({cap}): it could never start",
                f"at most {cap} GPUs in all nodes, or another class; an admin raises the cap "
                f"in the configuration: teams[{team}].class_caps.{prio}"))
        if problems:
            raise SpecError(problems)
        if prio == self.priority and team == self.team:
            return self
        return self.model_copy(update={"priority": prio, "team": team})


_ALLOWED_HINT = {
    "gpus": "0..64 per node",
    "nodes": "1..1024",
    "cpus": ">= 0",
    "memory_gb": ">= 0",
    "min_gpu_memory_gb": ">= 0",
    "sites": ", ".join(SITES),
    "time_limit": "a duration such as 30m, 6h, 2d, or seconds, > 0 and at most the "
                  "configuration's max_time_limit_s (30 days by default)",
    "deadline": "ISO 8601 time or epoch seconds, from 1970 to 9999",
    "max_price_per_hour": "dollars per hour > 0",
    "env": "names not empty, without '=' or NUL; values without NUL",
    "command": "an argv list or a shell string, without NUL bytes",
    "workdir": "a directory path without NUL bytes",
    "checkpoint_dir": "a directory path without NUL bytes",
}


def _items(v: Any, what: str) -> list[Any]:
    """A list field given as one string or a list of strings; ValueError otherwise."""
    if isinstance(v, str):
        return [v]
    if not isinstance(v, (list, tuple)) or not all(isinstance(i, str) for i in v):
        raise ValueError(f"must be a list of {what}")
    return list(v)


def _merged(errors: list[FieldError]) -> list[FieldError]:
    """One error per field: a union's members each report their own (``Input should be a
    valid list``, ``... a valid string``); say them as one, ``... or ...``."""
    out: dict[str, FieldError] = {}
    for err in errors:
        seen = out.get(err.field)
        if seen is None:
            out[err.field] = err
        elif err.problem not in seen.problem:
            head = "Input should be "
            more = err.problem.removeprefix(head) if seen.problem.startswith(head) else \
                err.problem
            out[err.field] = FieldError(err.field, f"{seen.problem} or {more}",
                                        seen.allowed or err.allowed)
    return list(out.values())


# pydantic's errors for a text that is not the number a field takes, said with the value
_NOT_A_NUMBER = {"int_parsing": "is not a whole number", "int_from_float": "is not a whole number",
                 "float_parsing": "is not a number"}


def _field_error(err: Mapping[str, Any]) -> FieldError:
    parts = [str(p) for p in err.get("loc", ()) if not str(p).startswith("function-")]
    msg = str(err.get("msg", "invalid")).removeprefix("Value error, ")
    if len(parts) == 3 and parts[2] == "[key]":  # a mapping's key (env's names): the mapping
        return FieldError(parts[0], f"name {parts[1]!r} {msg}",
                          _ALLOWED_HINT.get(parts[0], ""))
    loc = ".".join(parts)
    # pydantic reports a union (list[str] | str) under its member types (list[str],
    # list[constrained-str], str, constrained-str, ...); name the field itself.
    loc = re.sub(r"\.((list|dict|tuple)\[[^\]]*\]|[a-z-]*str|int|float|bool)(\.\d+)?$", "",
                 loc) or "spec"
    kind = err.get("type")
    if kind in _NOT_A_NUMBER and "input" in err:  # (`--gpus two`: the value, in words)
        msg = f"{shown(err['input'])} {_NOT_A_NUMBER[str(kind)]}"
    if kind == "extra_forbidden":
        close = difflib.get_close_matches(loc, list(JobSpec.model_fields), n=1)
        msg = "is not a JobSpec field" + (f"; did you mean {close[0]}?" if close else "")
        allowed = ", ".join(JobSpec.model_fields)
    elif kind == "missing":
        msg = "is required"
        allowed = ""
    else:
        allowed = _ALLOWED_HINT.get(loc.split(".")[0], "")
    return FieldError(loc, msg, allowed)
