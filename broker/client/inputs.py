"""What a caller gives the client, made ready for either transport: the cluster's URL
(:func:`resolve_url`), a state filter (:func:`parse_states`), a spec and its keyword fields as
one mapping (:func:`merged`), and a workdir taken against the submit directory
(:func:`submit_workdir`).
"""

from __future__ import annotations

import builtins
import os
from collections.abc import Iterable, Mapping
from typing import Any

from broker.config.core import Config
from broker.errors import ConfigError, FieldError, SpecError
from broker.model import JobSpec
from broker.model.state import JobState
from broker.store.reach import url_from_file

__all__ = ["StateFilter", "in_submit_dir", "merged", "parse_states", "resolve_url",
           "submit_workdir", "workdir_of"]

StateFilter = str | JobState | Iterable[str | JobState] | None


def resolve_url(redis_url: str | None, config: Config) -> str:
    """The cluster's URL: a Redis URL, or an API server's ``https://`` one (SPILLWAY_URL,
    after SPILLWAY_REDIS_URL as the CLI reads them)."""
    url = (redis_url or os.environ.get("SPILLWAY_REDIS_URL")
           or url_from_file(os.environ.get("SPILLWAY_REDIS_URL_FILE", ""))
           or os.environ.get("SPILLWAY_URL") or config.redis_url)
    if not url:
        raise ConfigError(
            "no Redis URL: pass redis_url / --redis-url, set SPILLWAY_REDIS_URL, set redis_url "
            "in the config file, or start a local cluster with `spillway up` (or set "
            "SPILLWAY_URL=https://... and SPILLWAY_TOKEN for an API server)"
        )
    return url


def parse_states(state: StateFilter) -> set[JobState] | None:
    """``"pending"``, ``"RUNNING,STARTING"``, a JobState or an iterable of them."""
    if state is None:
        return None
    items = [state] if isinstance(state, (str, JobState)) else builtins.list(state)
    out: set[JobState] = set()
    for item in items:
        if isinstance(item, JobState):
            out.add(item)
            continue
        for part in str(item).split(","):
            name = part.strip().upper()
            if not name:
                continue
            if name not in JobState.__members__:
                raise SpecError([FieldError("state", f"unknown job state {part.strip()!r}",
                                            ", ".join(JobState.__members__))])
            out.add(JobState[name])
    return out or None


def submit_workdir(workdir: str | None) -> str | None:
    """A workdir made absolute against the directory it is submitted from, as Slurm does: no
    workdir is the submit directory itself. (The agent runs the job there where that directory
    exists on its node, and in a directory of the job's own otherwise.)"""
    if workdir and (os.path.isabs(workdir) or workdir.startswith("~")):
        return workdir
    try:
        here = os.getcwd()
    except OSError:  # the submit directory was removed: the agent picks one
        return workdir
    return os.path.normpath(os.path.join(here, workdir)) if workdir else here


def workdir_of(data: dict[str, Any]) -> dict[str, Any]:
    """Fields whose workdir is taken against the submit directory (:func:`submit_workdir`)."""
    return {**data, "workdir": submit_workdir(data.get("workdir"))}


def in_submit_dir(spec: JobSpec) -> JobSpec:
    """A spec whose workdir is taken against the submit directory (:func:`submit_workdir`)."""
    workdir = submit_workdir(spec.workdir)
    return spec if workdir == spec.workdir else spec.model_copy(update={"workdir": workdir})


def merged(spec: JobSpec | Mapping[str, Any] | None, fields: Mapping[str, Any]
           ) -> dict[str, Any]:
    """A spec (JobSpec, mapping or None) and keyword fields as one mapping of fields."""
    if isinstance(spec, JobSpec):
        return {**spec.model_dump(exclude_unset=True), **fields}
    if spec is None:
        return dict(fields)
    if isinstance(spec, Mapping):
        return {**spec, **fields}
    raise SpecError([FieldError("spec", f"expected a JobSpec or a mapping, got "
                                        f"{type(spec).__name__}")])
