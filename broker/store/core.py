"""The store's core: what its parts see of a store.

:class:`StoreCore` is the declared interface of the store's parts (:mod:`broker.store.nodes`,
:mod:`broker.store.instances`, :mod:`broker.store.reports`, :mod:`broker.store.budgets`): the
persistence primitives a backend supplies (:class:`broker.store.backend.Backend`), the
configuration, and the one way a job is written (read, compute a Change, compare-and-set,
retry; the GPU time of an attempt it ends goes to fair-share usage). The parts type against it
and never import :mod:`broker.store.base`, whose :class:`~broker.store.base.BaseStore` holds the
rest of the rules on top of it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from broker.config.core import Config
from broker.errors import Conflict, Fenced, JobNotFound
from broker.model import Job
from broker.model.state import ACTIVE, JobState
from broker.store.backend import Backend
from broker.store.status import FENCED, OK, RETRIES, VERSION, Usage

if TYPE_CHECKING:
    from broker.store import transitions as T


class StoreCore(Backend):
    """A backend's primitives, the configuration and the job write (abstract: a backend
    subclasses :class:`~broker.store.base.BaseStore`)."""

    def __init__(self, config: Config | None = None) -> None:
        self.config = config or Config()
        Backend.__init__(self)

    def _update(self, job_id: str, fn: Callable[..., T.Change | None], *args: object) -> Job:
        """Read, compute a Change with ``fn``, compare-and-set; retry on a lost race."""
        for _ in range(RETRIES):
            job = self._load([job_id])[0]
            if job is None:
                raise JobNotFound(job_id)
            change = fn(job, *args)
            if change is None:
                return job
            status = self._commit([change])[0]
            if status == OK:
                self._attempt_ended(job, change.job)
                return change.job
            if status == FENCED:
                raise Fenced(self.fence_token() or "")
            if status != VERSION:
                raise Conflict(f"job {job_id}: write refused ({status})")
        raise Conflict(f"job {job_id}: too many concurrent writers")

    def _attempt_ended(self, old: Job, new: Job) -> None:
        """Account an attempt that just ended: its GPU time goes to the team's fair-share
        usage, and a job that finished on its own teaches the runtime predictor."""
        usage = self._usage_of(old, new)
        if usage is not None:
            self._add_usage(*usage)

    def _usage_of(self, old: Job, new: Job) -> Usage | None:
        """The ``_add_usage`` arguments for the change ``old`` -> ``new``; None if it ended no
        attempt."""
        if old.state not in ACTIVE or (new.state in ACTIVE and new.attempt == old.attempt):
            return None
        att = next((a for a in new.attempts if a.number == old.attempt), None)
        if att is None or att.ended_at is None or old.started_at is None:
            return None
        ran = max(0.0, att.ended_at - old.started_at)
        sample = None
        if new.state is JobState.SUCCEEDED and new.attempt == 1:
            sample = (old.team, old.kind_key, old.res.total_gpus, old.spec.time_limit or 0.0, ran)
        return (old.team, old.res.total_gpus * ran, att.ended_at,
                self.config.fairshare_half_life_s, sample)

    def _add_usage_many(self, usages: Sequence[Usage]) -> None:
        """``_add_usage`` for each, in order (backends may do it in one round trip)."""
        for usage in usages:
            self._add_usage(*usage)

    def _cached_jobs(self, job_ids: Sequence[str]) -> list[Job | None]:
        """The copy of each job this backend holds without a read, if any (a guess: it may be
        older than the store's)."""
        return [None] * len(job_ids)

    def usage(self, now: float, raw: Mapping[str, tuple[float, float]] | None = None
              ) -> dict[str, float]:
        """Team -> GPU-seconds of finished attempts, decayed to ``now``."""
        hl = self.config.fairshare_half_life_s
        return {t: v * 0.5 ** (max(0.0, now - at) / hl) for t, (v, at) in
                (self._read_usage() if raw is None else raw).items()}

    def runtimes(self, after: str = "0") -> tuple[list[tuple[str, str, int, float, float]],
                                                  str]:
        """The runtime samples of attempts that ended on their own, after the cursor ``after``
        ("0": from the oldest kept), and the new cursor: (team, name, GPUs, limit, seconds)."""
        return self._read_runtimes(after)
