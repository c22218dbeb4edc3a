"""The broker's error hierarchy. Every error says what went wrong and what to do next."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


class SpillwayError(Exception):
    """Base of every error Spillway raises on purpose."""


@dataclass(frozen=True)
class FieldError:
    """One problem with one field of user input."""

    field: str
    problem: str
    allowed: str = ""

    def __str__(self) -> str:
        text = f"{self.field}: {self.problem}"
        return f"{text} (allowed: {self.allowed})" if self.allowed else text

    def to_dict(self) -> dict[str, str]:
        return {"field": self.field, "problem": self.problem, "allowed": self.allowed}


class SpecError(SpillwayError, ValueError):
    """A JobSpec (or other user input) was refused. Nothing was stored."""

    def __init__(self, errors: Sequence[FieldError]) -> None:
        self.errors = tuple(errors)
        lines = "\n".join(f"  - {e}" for e in self.errors)
        super().__init__(f"invalid job spec ({len(self.errors)} problem(s)):\n{lines}")


class ConfigError(SpillwayError):
    """The configuration file or environment is invalid."""


class InvalidTransition(SpillwayError):
    """A job (or a node, an instance: ``what``) was asked to move along an edge its state
    machine does not have. ``job_id`` is the id of whatever was asked to move."""

    def __init__(self, job_id: str, src: str, dst: str, what: str = "job") -> None:
        self.job_id, self.src, self.dst, self.what = job_id, src, dst, what
        super().__init__(f"{what} {job_id}: illegal state change {src} -> {dst}")


class CycleFailed(SpillwayError):
    """A scheduling cycle could not complete: its policies kept failing on jobs, pass after
    pass (broker/cycle/scheduler.py ``run_cycle``). The scheduler counts it as a failed cycle and
    runs the next; the cause is the first exception of the last pass."""


class StoreError(SpillwayError):
    """Base of store errors."""


class StoreUnreachable(StoreError, ConnectionError):
    """Redis did not answer. ``url`` is where it was looked for (its password hidden)."""

    def __init__(self, url: str, cause: object = None) -> None:
        self.url = url
        why = f" ({cause})" if cause else ""
        super().__init__(
            f"cannot reach Redis at {url}{why}; start Redis there (or `spillway up` for a "
            "local cluster), or point redis_url / --redis-url / SPILLWAY_REDIS_URL at a "
            "running server")


class StoreRefused(StoreUnreachable):
    """Redis answered but refused this client: a wrong password or user (AUTH), or a user
    without the rights for a command or key (NOPERM). ``url`` has its password hidden."""

    def __init__(self, url: str, cause: object = None) -> None:
        self.url = url
        text = str(cause or "").strip()
        if "NOPERM" in text or "no permissions" in text:
            hint = ("its Redis user may not do this; use the URL of a user with the rights "
                    "this command needs (`spillway redis acl` and docs/security.md list them)")
        else:
            hint = ("check the user and password in the URL (redis://USER:PASSWORD@HOST:PORT/"
                    "DB, from --redis-url, SPILLWAY_REDIS_URL or redis_url); `spillway up` "
                    "keeps its URL in redis.url beside its data")
        StoreError.__init__(self, f"Redis at {url} refused the connection ({text}); {hint}")


class JobNotFound(StoreError, KeyError):
    def __init__(self, job_id: str) -> None:
        self.job_id = job_id
        super().__init__(f"no job with id {job_id!r}; `spillway queue --all` lists known jobs")

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


class StaleAttempt(StoreError):
    """A worker acted on an attempt that is no longer the job's current one (fencing)."""

    def __init__(self, job_id: str, attempt: int, current: int, state: str) -> None:
        self.job_id, self.attempt, self.current, self.state = job_id, attempt, current, state
        super().__init__(
            f"job {job_id}: attempt {attempt} is stale (current attempt {current}, state {state});"
            " the worker must stop acting on it"
        )


class Conflict(StoreError):
    """A compare-and-set write lost a race too many times."""


class Fenced(StoreError):
    """A write made under a leader's fencing token after that leadership ended: refused."""

    def __init__(self, token: str) -> None:
        super().__init__(
            f"leadership {token} has ended (its lease expired or another scheduler took over); "
            "the write was refused and this scheduler stops acting as the leader")


class NodeNotFound(StoreError, KeyError):
    def __init__(self, node_id: str) -> None:
        self.node_id = node_id
        super().__init__(f"no node with id {node_id!r}; `spillway nodes` lists known nodes")

    def __str__(self) -> str:
        return str(self.args[0])


class NodeBusy(StoreError):
    """A node that may not be forgotten now (its agent is alive, or jobs are still recorded
    on it); the message says why and what to do."""
