"""Runtime predictor: how long will a job run, learned from the jobs that finished before it.

A job is matched to earlier jobs of the same team with the same name (or command), the same
GPU count and the same time limit; when that group has too few samples, to the same team,
GPU count and limit; then to the same team and limit; then to the limit alone. The estimate is
a high quantile (default p90) of the group's recent runtimes, never above the job's time limit.
A job with no history and no limit gets ``default_s``. This follows the spirit of Tsafrir,
Etsion and Feitelson, "Backfilling Using System-Generated Predictions Rather than User Runtime
Estimates" (IEEE TPDS 2007): recent runtimes of similar jobs predict far better than the limits
users write.

The predictor is the only stateful piece of scheduling: the store feeds it finished runtimes
(``observe``) and a cycle only reads it (``estimate``, ``expected_end``).
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from collections.abc import Callable, Hashable

from broker.cycle.plan import Snapshot
from broker.model import Job
from policies.registry import register

Key = tuple[Hashable, ...]


class _Group:
    __slots__ = ("recent", "sorted")

    def __init__(self) -> None:
        self.recent: deque[float] = deque()
        self.sorted: list[float] = []


class RuntimePredictor:
    def __init__(self, quantile: float = 0.9, window: int = 64, min_samples: int = 4,
                 default_s: float = math.inf) -> None:
        self.quantile = quantile
        self.window = window
        self.min_samples = min_samples
        self.default_s = default_s
        self._groups: dict[Key, _Group] = {}
        self.observed = 0
        # quantile -> job id -> (observed then, estimate)
        self._memos: dict[float | None, dict[str, tuple[int, float]]] = {}

    REFRESH = 32  # a job's estimate is recomputed after this many new observations

    @property
    def version(self) -> int:
        """Changes each time memoised estimates may be refreshed (every REFRESH runtimes)."""
        return self.observed // self.REFRESH
    @staticmethod
    def keys(team: str, name: str | None, gpus: int, limit: float | None) -> tuple[Key, ...]:
        """From the most to the least specific group."""
        return (("n", team, name, gpus, limit), ("g", team, gpus, limit), ("t", team, limit),
                ("l", limit))

    @staticmethod
    def job_keys(job: Job) -> tuple[Key, ...]:
        return RuntimePredictor.keys(job.team, job.kind_key, job.res.total_gpus,
                                     job.spec.time_limit)

    def observe(self, keys: tuple[Key, ...], runtime_s: float) -> None:
        """Record the runtime of a job that finished on its own (not cancelled or killed)."""
        self.observed += 1
        for key in keys:
            g = self._groups.get(key)
            if g is None:
                g = self._groups[key] = _Group()
            g.recent.append(runtime_s)
            bisect.insort(g.sorted, runtime_s)
            if len(g.recent) > self.window:
                old = g.recent.popleft()
                del g.sorted[bisect.bisect_left(g.sorted, old)]

    def predict(self, keys: tuple[Key, ...], limit: float | None,
                quantile: float | None = None) -> float:
        cap = limit if limit else math.inf
        q = self.quantile if quantile is None else quantile
        for key in keys:
            g = self._groups.get(key)
            if g is not None and len(g.sorted) >= self.min_samples:
                s = g.sorted
                return min(cap, s[min(len(s) - 1, int(q * len(s)))])
        return min(cap, self.default_s)

    def estimate(self, job: Job, quantile: float | None = None) -> float:
        """Total runtime estimate of a job, in seconds (inf: unknown and unbounded): the
        predictor's quantile (for backfill) or another (the median, to rank the queue).
        Memoised per job until ``REFRESH`` more runtimes have been observed."""
        memos = self._memos.get(quantile)
        if memos is None:
            memos = self._memos[quantile] = {}
        memo = memos.get(job.id)
        if memo is not None and self.observed - memo[0] < self.REFRESH:
            return memo[1]
        est = self.predict(self.job_keys(job), job.spec.time_limit, quantile)
        if len(memos) > 200_000:
            memos.clear()
        memos[job.id] = (self.observed, est)
        return est


def expected_end(job: Job, estimate: float, now: float) -> float:
    """When a running job will free its GPUs. A job that outran its estimate is expected to
    run on for half as long again as it has so far (at least a minute), within its limit."""
    start = job.started_at if job.started_at is not None else now
    end = start + estimate
    if end > now:
        return end
    elapsed = now - start
    extra = max(60.0, 0.5 * elapsed)
    limit = job.spec.time_limit
    if limit:
        return max(now, min(now + extra, start + limit))
    return now + extra


def _time_limit(job: Job) -> float:
    return job.spec.time_limit or math.inf


@register("estimate", "limit")
def by_limit(snapshot: Snapshot) -> Callable[[Job], float]:
    """A job runs as long as its time limit (inf: it has none), as Slurm's backfill assumes."""
    del snapshot
    return _time_limit


@register("estimate", "predictor")
def by_predictor(snapshot: Snapshot) -> Callable[[Job], float]:
    """The runtime predictor's estimate (the snapshot carries it), else the time limit."""
    pred = snapshot.predictor
    return pred.estimate if pred is not None else _time_limit
