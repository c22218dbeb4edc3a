"""The worker agent's Prometheus series (prometheus-client), in the agent process's registry.

:func:`agent_metrics` gives this process's :class:`AgentMetrics`, served on ``/metrics`` by
:func:`broker.metrics.http.serve` on ``agent_metrics_port`` (broker/config/core.py; 0
disables). Names follow Prometheus' conventions (see :mod:`broker.metrics.scheduler`);
docs/operations.md lists them. This module imports nothing of the scheduler's: the agent loads
it and :mod:`broker.metrics.http` only.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge

__all__ = ["AgentMetrics", "agent_metrics", "outcome"]


def outcome(exit_code: int | None) -> str:
    """A job part's end, for ``spillway_agent_job_ends_total{outcome}``: succeeded (exit 0),
    signalled (killed by a signal: a preemption, a cancel, a time limit) or failed."""
    if exit_code == 0:
        return "succeeded"
    if exit_code is None or exit_code > 128:
        return "signalled"
    return "failed"


class AgentMetrics:
    """A worker agent's metrics, in their own registry."""

    def __init__(self, registry: CollectorRegistry | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.registry = r = registry or CollectorRegistry()
        self._clock = clock
        self._last_beat = clock()  # before the first heartbeat: time since the agent began
        self.heartbeat_lag = Gauge(
            "spillway_agent_heartbeat_lag_seconds",
            "Seconds since this agent's last successful heartbeat", registry=r)
        self.heartbeat_lag.set_function(lambda: max(0.0, self._clock() - self._last_beat))
        self.running = Gauge("spillway_agent_jobs_running",
                             "Job processes (parts of jobs) running on this node", registry=r)
        self.starts = Counter("spillway_agent_job_starts_total",
                              "Job processes this agent started", registry=r)
        self.ends = Counter("spillway_agent_job_ends_total",
                            "Job processes that ended on this node, by outcome "
                            "(succeeded, failed, signalled)", ["outcome"], registry=r)
        for name in ("succeeded", "failed", "signalled"):
            self.ends.labels(name)

    def beat(self, now: float | None = None) -> None:
        """A heartbeat reached the store."""
        self._last_beat = self._clock() if now is None else now

    def started(self, count: int = 1) -> None:
        self.starts.inc(count)

    def ended(self, exit_code: int | None) -> None:
        self.ends.labels(outcome(exit_code)).inc()

    def count_running(self, fn: Callable[[], int]) -> None:
        """Read the number of running job processes from ``fn`` at each scrape."""
        self.running.set_function(lambda: float(fn()))


# -- one registry per process ----------------------------------------------------------------

_agent: AgentMetrics | None = None
_made = threading.Lock()


def agent_metrics() -> AgentMetrics:
    """This process's agent metrics, made on the first call."""
    global _agent
    with _made:
        if _agent is None:
            _agent = AgentMetrics()
        return _agent
