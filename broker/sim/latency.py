"""The real system's delays, as an opt-in model for the simulator.

The ideal simulator (:class:`~broker.sim.engine.Simulation`) runs a cycle at the very instant
of every event, starts a job's process the instant the cycle decides, and frees its GPUs the
instant the process exits. The real system does none of that: a cycle runs after the event
has reached the scheduler (and after the cycle already running), a start travels as a Celery
message to the node's agent, which forks the process and reports it, and an exit travels back
the same way. :class:`Latencies` names each of these delays; :class:`LatencySimulation` is the
simulator with them. Every delay defaults to 0, which is the ideal simulator exactly:
``spillway simulate`` never uses this module; ``spillway fidelity`` measures the delays on the
real system and feeds them in (docs/fidelity.md has the measured values).
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, fields, replace
from typing import Any

from broker.cycle.plan import Snapshot
from broker.errors import ConfigError
from broker.model import Job
from broker.model.state import JobState
from broker.sim.cloudrun import BOOT, IDLE, CloudRun
from broker.sim.cluster import Cluster
from broker.sim.engine import Simulation
from broker.sim.runs import END, WAKE
from broker.sim.types import Trace
from policies.registry import PolicySet

_CYCLE = "~cycle"  # the id of a delayed cycle's wake-up event (a plan's wake-up has "")


@dataclass(frozen=True)
class Latencies:
    """Delays of the real system, in seconds of the simulated clock (0: none, the default).

    ``cycle_s``: an event (an arrival, a job's end) -> the cycle that sees it; events that
    arrive meanwhile are seen by the same cycle. ``dispatch_s``: the cycle's decision -> the
    job's process runs (its GPUs are held meanwhile; its wait ends when it runs).
    ``end_s``: the process exits -> its GPUs are free. ``stop_s``: added to the time an
    evicted job takes to checkpoint and exit (SIGTERM -> its exit is known).
    ``period_s``: the scheduler's periodic cycle: a plan's wake-up (``Plan.wake_at``) is served
    at the next multiple of it, since the real scheduler does not wake for it (0: at once).
    ``dispatch_samples``: if given, each attempt's dispatch delay is one of these (measured
    ones, so the tail is kept), drawn by a hash of the job id and attempt (deterministic)
    instead of ``dispatch_s``.

    Cloud sites (a cluster with a ``cloud`` section): ``launch_s``: a plan's launch -> the
    provider has started the machine (the ``provision`` queue's message, the provisioner's
    store reads, the provider's call); ``register_s``: the machine has booted -> its agent has
    registered (the agent's own start-up: imports, inventory, first heartbeat). Both delay
    the instance's readiness beyond its boot time, and both are in the offers' ``boot_s``
    the policies read: production learns each offer's boot from request to registration
    (broker/store/boots.py), so its burst decisions count them too. ``release_s``: an idle
    cloud node is released this long after its idle timeout (the lifecycle pass that notices
    it, the drain, the termination)."""

    cycle_s: float = 0.0
    dispatch_s: float = 0.0
    end_s: float = 0.0
    stop_s: float = 0.0
    period_s: float = 0.0
    dispatch_samples: tuple[float, ...] = ()
    # measured by the fidelity run on a loaded 2-core machine (docs/fidelity.md), real s:
    launch_s: float = 0.0  # 0.045-0.070
    register_s: float = 0.0  # 3.9-6.2 (an agent's start-up under load)
    release_s: float = 0.0  # 1.9-3.1 (lifecycle passes every 1 s, drain, terminate)

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            for v in value if isinstance(value, tuple) else (value,):
                if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                    raise ConfigError(f"latency {f.name}: {v!r} is not allowed; use seconds "
                                      ">= 0 (0: none)")

    @property
    def off(self) -> bool:
        return not any(getattr(self, f.name) for f in fields(self))

    def dispatch(self, job_id: str, attempt: int) -> float:
        """The dispatch delay of one attempt."""
        xs = self.dispatch_samples
        if not xs:
            return self.dispatch_s
        h = hashlib.blake2b(f"{job_id}:{attempt}".encode(), digest_size=8).digest()
        return xs[int.from_bytes(h, "big") % len(xs)]

    def times(self, k: float) -> Latencies:
        """Every delay multiplied by ``k`` (real seconds -> trace seconds at time scale k)."""
        scaled: dict[str, Any] = {f.name: getattr(self, f.name) * k for f in fields(self)
                                  if f.name != "dispatch_samples"}
        return Latencies(**scaled, dispatch_samples=tuple(v * k for v in
                                                          self.dispatch_samples))

    def as_dict(self) -> dict[str, float]:
        """The delays (``dispatch_samples`` as their count and mean)."""
        out = {f.name: round(getattr(self, f.name), 6) for f in fields(self)
               if f.name != "dispatch_samples"}
        xs = self.dispatch_samples
        if xs:
            out["dispatch_samples_n"] = len(xs)
            out["dispatch_samples_mean"] = round(sum(xs) / len(xs), 6)
        return out


class LifecycleCloudRun(CloudRun):
    """The simulator's clouds; kept for ``lifecycle=True``. Production and the simulator
    share one scale-down rule (broker/cloud/lifecycle.py :func:`scale_down`), so it is
    :class:`CloudRun` itself."""


class LatencySimulation(Simulation):
    """The simulator with :class:`Latencies`. With every delay 0 it is the ideal simulator.
    ``lifecycle``: cloud nodes are scaled down as production does it
    (:class:`LifecycleCloudRun`; False, the default: the simulator's own rule)."""

    def __init__(self, cluster: Cluster, trace: Trace, policy: str | PolicySet = "spillway",
                 *, latencies: Latencies = Latencies(), lifecycle: bool = False,
                 **kw: Any) -> None:
        super().__init__(cluster, trace, policy, **kw)
        if lifecycle and cluster.cloud is not None:
            self.cloud = LifecycleCloudRun(self, cluster.cloud, int(kw.get("seed", 0)))
        self.lat = latencies
        self.stop_delay_s += latencies.stop_s
        self._booted: dict[str, float] = {}  # offer id -> when its first machine was ready
        self._due: float | None = None  # when the delayed cycle runs
        self._plan_wakes: set[float] = set()

    def _push(self, t: float, kind: int, job_id: str, attempt: int = 0) -> None:
        late = self.lat.launch_s + self.lat.register_s
        if kind == BOOT and late > 0 and self.cloud is not None:
            t += late  # (BOOT is pushed once per instance, at its launch)
            inst = self.cloud.clouds.instances.get(job_id)
            if inst is not None:
                inst.ready_at = t
                oid = inst.record.offer_id
                self._booted[oid] = min(t, self._booted.get(oid, t))
        elif kind == IDLE and self.lat.release_s > 0:
            t += self.lat.release_s
        if kind == WAKE and job_id == "" and self.lat.period_s > 0:
            t = math.ceil(t / self.lat.period_s) * self.lat.period_s  # the next periodic cycle
            self._plan_wakes.add(t)
        super()._push(t, kind, job_id, attempt)

    def _dressed(self, snap: Snapshot, now: float) -> Snapshot:
        """The snapshot, its offers' ``boot_s`` as production's estimate has it: the declared
        boot until the offer's first machine registered, then what that machine took (launch
        and registration included: the first observation replaces the seed, and every later
        one is the same here; broker/store/boots.py)."""
        snap = super()._dressed(snap, now)
        late = self.lat.launch_s + self.lat.register_s
        if late <= 0 or not self._booted:
            return snap
        return replace(snap, offers=tuple(
            replace(o, extra={**o.extra, "boot_s": float(o.extra.get("boot_s", 0.0)) + late})
            if self._booted.get(o.id, math.inf) <= now else o for o in snap.offers))

    def _cycle(self, now: float, force: bool = False) -> None:
        if self.lat.cycle_s <= 0:
            super()._cycle(now, force)
            return
        if (self._due is not None and now >= self._due) or now in self._plan_wakes:
            self._due = None  # the delayed cycle (or a periodic one) sees all that happened
            self._plan_wakes.discard(now)
            super()._cycle(now, force)
            return
        if self._due is None:
            self._due = now + self.lat.cycle_s
            super()._push(self._due, WAKE, _CYCLE)
        self._sample(now)

    def _started(self, job: Job, now: float) -> None:
        # the process runs, its clock starts
        super()._started(job, now + self.lat.dispatch(job.id, job.attempt))
        run = self.runs[job.id]
        if self.lat.end_s > 0:  # its GPUs are free this much after it exits (the END pushed
            run.end_at += self.lat.end_s  # for the exit itself is ignored: end_at moved on)
            self._push(run.end_at, END, job.id, job.attempt)

    def _stopped(self, job_id: str, attempt: int, now: float) -> None:
        run = self.runs.get(job_id)
        if run is not None and run.attempt == attempt:
            job = self.store.get(job_id)
            stop = next((h for h in reversed(job.history) if h.state is JobState.STOPPING),
                        None)
            if stop is not None and stop.time < run.started:
                run.started = stop.time  # evicted before its process ran: no work done
        super()._stopped(job_id, attempt, now)
