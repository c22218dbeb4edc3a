"""Prometheus metrics of the cloud machines Spillway rents (prometheus-client).

Two sources, one set of series:

- the leader's cycles (:meth:`CloudMetrics.observe_snapshot`, called by
  :class:`broker.metrics.scheduler.SchedulerMetrics` on its gauge passes): instances by state,
  how long the oldest has been in its state, and what the machines running now cost an hour.
  Every live state is exported, 0 when no machine is in it, so an on-prem cluster reads 0,
  not nothing;
- the provisioner (broker/cloud/provisioner.py, inside the scheduler by default, or ``spillway
  provisioner`` on its own with a registry of its own): launches, launches that gave no usable
  machine (by reason), the boot time of each machine (request to its agent's registration),
  the orphans the last lifecycle pass found, and those it gave back.

Like the rest of the scheduler's gauges, the snapshot's are the leader's view and are
removed (the orphans: set to 0) when it stops leading.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from broker.cycle.plan import Snapshot
from broker.model import Instance, InstanceState

__all__ = ["BOOT_BUCKETS", "LIVE", "CloudMetrics", "entered", "instance_gauges"]

I = InstanceState  # noqa: E741
#: the states of a machine that has not ended, each exported (0 when none is in it)
LIVE = (I.REQUESTED, I.BOOTING, I.READY, I.DRAINING)
#: the provider bills a machine in these (broker/money/ledger.py: from its first BOOTING on)
BILLED = frozenset({I.BOOTING, I.READY, I.DRAINING})
#: boot seconds (request to agent registered): a cloud GPU machine takes about 1 to 10 minutes;
#: the default boot_timeout_s is 600
BOOT_BUCKETS = (1.0, 5.0, 15.0, 30.0, 60.0, 90.0, 120.0, 180.0, 300.0, 450.0, 600.0, 900.0,
                1800.0)


def entered(inst: Instance) -> float:
    """When the record entered its current state (its request time if it never moved)."""
    for h in reversed(inst.history):
        if h.state is inst.state:
            return h.time
    return inst.requested_at


def instance_gauges(now: float, instances: Iterable[Instance]
                    ) -> tuple[dict[str, float], dict[str, float], float]:
    """Live instances by state, how long the oldest in each state has been in it (0: none),
    and the dollars per hour of the billed ones."""
    count = {s.value: 0.0 for s in LIVE}
    oldest = {s.value: 0.0 for s in LIVE}
    spend = 0.0
    for inst in instances:
        if inst.state not in LIVE:
            continue
        key = inst.state.value
        count[key] += 1
        oldest[key] = max(oldest[key], now - entered(inst))
        if inst.state in BILLED:
            spend += inst.price_per_hour
    return count, oldest, spend


class CloudMetrics:
    """The cloud series, in ``registry`` (the scheduler's, or a provisioner's own)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = r = registry or CollectorRegistry()
        # -- the leader's view, from each gauge pass over the cycle's snapshot
        self.instances = Gauge(
            "spillway_instances", "Cloud instances rented and not ended, by state (REQUESTED, "
            "BOOTING, READY, DRAINING)", ["state"], registry=r)
        self.instances_oldest = Gauge(
            "spillway_instances_oldest_seconds", "Time the oldest instance in each state has "
            "been in it, 0 when none is (REQUESTED or BOOTING for long: stuck)", ["state"],
            registry=r)
        self.spend = Gauge(
            "spillway_cloud_spend_dollars_per_hour", "What the cloud machines billed now "
            "(BOOTING, READY, DRAINING) cost an hour, at their launch prices", registry=r)
        # -- what the provisioner did
        self.orphans = Gauge(
            "spillway_orphan_instances", "Cloud machines tagged with this cluster that the "
            "store does not know (or whose record has ended), found by the last lifecycle "
            "pass; each is terminated when found, so one that stays is one that will not go",
            registry=r)
        self.reaped = Counter(
            "spillway_orphans_reaped_total", "Orphan machines the lifecycle terminated, by "
            "provider", ["provider"], registry=r)
        self.launches = Counter(
            "spillway_instance_launches_total", "Machines the provisioner launched (the "
            "provider accepted them), by provider", ["provider"], registry=r)
        self.launch_failures = Counter(
            "spillway_instance_launch_failures_total", "Requested machines that never became "
            "usable, by provider and reason (the provider error's code, gave-up after the "
            "retries, agent-cannot-join, not-launched or boot-timeout)", ["provider", "reason"],
            registry=r)
        self.boot_seconds = Histogram(
            "spillway_instance_boot_seconds", "Seconds from a machine's request to its agent's "
            "registration (READY), by provider", ["provider"], buckets=BOOT_BUCKETS,
            registry=r)
        self._lock = threading.Lock()

    def know(self, providers: Iterable[str]) -> None:
        """Export the configured providers' counters at 0 before their first event."""
        for name in providers:
            self.launches.labels(name)
            self.reaped.labels(name)
            self.boot_seconds.labels(name)

    # -- the leader's cycles -----------------------------------------------------------------

    def observe_snapshot(self, snap: Snapshot) -> None:
        count, oldest, spend = instance_gauges(snap.now, snap.instances)
        with self._lock:
            for state, n in count.items():
                self.instances.labels(state).set(n)
                self.instances_oldest.labels(state).set(oldest[state])
            self.spend.set(spend)

    def clear(self) -> None:
        """This scheduler stopped leading: the leader's gauges are no longer its to report."""
        with self._lock:
            self.instances.clear()
            self.instances_oldest.clear()
            self.spend.set(0.0)
            self.orphans.set(0.0)

    # -- the provisioner ---------------------------------------------------------------------

    def launched(self, provider: str) -> None:
        self.launches.labels(provider).inc()

    def launch_failed(self, provider: str, reason: str) -> None:
        self.launch_failures.labels(provider, reason or "unknown").inc()

    def booted(self, provider: str, seconds: float) -> None:
        self.boot_seconds.labels(provider).observe(max(0.0, seconds))

    def observe_orphans(self, found: int, reaped: Mapping[str, int]) -> None:
        """One lifecycle pass: the orphans it found, and those it terminated by provider."""
        self.orphans.set(found)
        for provider, n in reaped.items():
            self.reaped.labels(provider).inc(n)
