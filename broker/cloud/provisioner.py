"""The provisioner: carries out launches and terminations with the configured providers, and
runs the machines' lifecycle (:mod:`broker.cloud.lifecycle`).

It runs where the cloud credentials are: inside the scheduler service (``spillway scheduler``,
the default) or as its own process (``spillway provisioner``); never on a GPU node. Launch and
terminate messages arrive on the ``provision`` queue (broker/cloud/tasks.py holds the thin
Celery tasks); each re-reads the instance record, so a repeated message does nothing twice: a
record that is no longer REQUESTED is not launched again, and the provider's launch is itself
idempotent by the request id written into the machine's tags.

Provider errors say what to do next: :class:`~providers.base.Retry` propagates (the task
retries with a bounded backoff), :class:`~providers.base.FailOver` marks the record FAILED and
cools the offer's zone down for ``cooldown_s``, :class:`~providers.base.Stop` marks it FAILED
with one clear log line.

What it does is counted in :class:`~broker.metrics.cloud.CloudMetrics` (the scheduler's
registry when it runs inside the scheduler): launches, launches that gave no usable machine
and why, each machine's boot time, the orphans found and reaped.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence

from broker.bus import commands
from broker.bus.runtime import Runtime
from broker.cloud.lifecycle import IDLE_DRAIN, RESEND_AFTER_S, Step, Timeouts, decide
from broker.config.providers import ProviderSettings
from broker.errors import JobNotFound
from broker.metrics.cloud import CloudMetrics
from broker.model import Instance, InstanceState, Node, NodeState, Offer
from broker.model.state import ACTIVE, LEAVES_MACHINE, JobState
from broker.money.ledger import accrue_store
from broker.security import cloud_agent
from broker.security.acl import AclError
from broker.store.budgets import budget_book
from broker.store.instances import block_key_of, request_ids
from providers.base import (
    CloudMachine,
    FailOver,
    MissingExtra,
    Provider,
    ProviderConfigError,
    ProviderError,
    Resources,
    Retry,
    Stop,
    make_provider,
)
from providers.userdata import render

log = logging.getLogger(__name__)
I = InstanceState  # noqa: E741
OFFERS_EVERY_S = 60.0  # the providers' offers are published this often
FORGET_AFTER_S = 300.0  # the node of a machine given back is listed DOWN this long, then dropped


class Provisioner:
    """One process's providers (built on first use) and what it does with them."""

    def __init__(self, rt: Runtime, providers: Mapping[str, Provider] | None = None,
                 clock: Callable[[], float] = time.time,
                 metrics: CloudMetrics | None = None) -> None:
        self.rt, self.clock = rt, clock
        self.metrics = metrics or CloudMetrics()  # (none given: a registry no one serves)
        self.metrics.know(rt.config.providers)
        self._providers: dict[str, Provider] = dict(providers or {})
        self._idle_since: dict[str, float] = {}
        self._low_since: dict[str, float] = {}  # READY nodes under half busy, since when
        self._resent: dict[str, float] = {}  # request id -> when its launch was sent again
        self._offers_at = -1e18
        self.counts: Counter[str] = Counter()

    # -- providers -------------------------------------------------------------------------

    @property
    def settings(self) -> Mapping[str, ProviderSettings]:
        return self.rt.config.providers

    def provider(self, name: str) -> Provider:
        """The provider configured as ``name``; Stop if there is none or it cannot be built."""
        if name not in self._providers:
            cfg = self.settings.get(name)
            if cfg is None:
                raise Stop(name, f"no provider named {name!r} is configured (providers: "
                           f"{', '.join(self.settings) or 'none'})", code="unknown-provider")
            try:
                self._providers[name] = make_provider(name, cfg.provider_settings(),
                                                      self.rt.config.cluster_name)
            except (ProviderConfigError, MissingExtra, ValueError) as e:
                raise Stop(name, str(e), code="configuration") from None
        return self._providers[name]

    def find_offer(self, offer_id: str) -> Offer | None:
        provider = self.provider(offer_id.split(":", 1)[0])
        return next((o for o in provider.offers(Resources()) if o.id == offer_id), None)

    # -- launch ----------------------------------------------------------------------------

    def launch(self, offer_id: str, count: int, request_id: str) -> list[Instance]:
        """Launch the REQUESTED records of one launch request. Retry propagates."""
        out = []
        for rid in request_ids(request_id, count):
            inst = self.launch_one(rid)
            if inst is not None:
                out.append(inst)
        return out

    def launch_one(self, request_id: str) -> Instance | None:
        store = self.rt.store
        inst = store.instance(request_id)
        if inst is None:
            log.warning("launch %s: no such instance record; nothing launched", request_id)
            return None
        if inst.state is not I.REQUESTED:
            return inst  # launched before (a repeated message): nothing to do
        try:
            return self._launch(inst)
        except FailOver as e:
            self.counts["failovers"] += 1
            cfg = self.settings.get(inst.provider)
            cool = cfg.cooldown_s if cfg else 0.0
            store.block(block_key_of(inst.offer_id), self.clock() + cool, str(e))
            log.warning("launch %s of %s failed over: %s; zone cools down %.0fs", request_id,
                        inst.offer_id, e, cool)
            return self._fail(request_id, f"no capacity: {e}", e.code or "no-capacity")
        except Stop as e:
            log.error("launch %s of %s stopped: %s", request_id, inst.offer_id, e)
            return self._fail(request_id, f"stopped: {e}", e.code or "stopped")

    def give_up(self, request_id: str, count: int, error: Exception) -> None:
        """After the last retry: the records still REQUESTED fail."""
        for rid in request_ids(request_id, count):
            self._fail(rid, f"gave up retrying: {error}", "gave-up")
        log.error("launch %s: gave up retrying: %s", request_id, error)

    def _fail(self, request_id: str, reason: str, code: str) -> Instance | None:
        """Fail the record; counted (by ``code``) if this call is what failed it."""
        before = self.rt.store.instance(request_id)
        done = self.rt.store.move_instance(request_id, I.FAILED, self.clock(), reason)
        if before is not None and not before.ended and done is not None \
                and done.state is I.FAILED:
            self.metrics.launch_failed(done.provider, code)
        return done

    def _launch(self, inst: Instance) -> Instance | None:
        cfg = self.settings.get(inst.provider)
        provider = self.provider(inst.provider)  # Stop if unknown
        assert cfg is not None
        now = self.clock()
        block = self.rt.store.blocks(now).get(block_key_of(inst.offer_id))
        if block is not None:
            raise FailOver(inst.provider, f"zone cools down for {block.until - now:.0f}s more "
                           f"({block.reason})", code="cooling-down")
        live = [i for i in self.rt.store.instances(live_only=True)
                if i.provider == inst.provider and i.state is not I.REQUESTED]
        if len(live) >= cfg.max_instances:
            raise Stop(inst.provider, f"max_instances {cfg.max_instances} reached "
                       f"({len(live)} live)", code="max-instances")
        offer = self.find_offer(inst.offer_id)
        if offer is None:
            raise Stop(inst.provider, f"offer {inst.offer_id} is not offered", code="no-offer")
        try:  # the machine's own Redis user, made by the registrar (never ours)
            join = cloud_agent.prepare(self.rt, cfg.kind, cfg.broker_url, inst.request_id,
                                       wait_s=cfg.registrar_wait_s)
        except (AclError, OSError) as e:
            raise Stop(inst.provider, f"cannot make the machine's Redis credentials: {e}",
                       code="agent-user") from None
        user_data = render(offer, cfg.kind, join.url, inst.request_id, cfg.install,
                           cfg.worker, ca_pem=join.ca_pem)
        machines = provider.launch(offer, 1, inst.request_id, user_data)
        if not machines:
            raise Retry(inst.provider, "the launch returned no machine", code="empty")
        m = machines[0]
        problem = join.finish(self.rt, m.provider_id)  # its agent's node id
        if problem:  # it could never register: given back at once, not after boot_timeout_s
            return self._give_back(inst, provider, m, problem)
        self.counts["launched"] += 1
        self.metrics.launched(inst.provider)
        log.info("launched %s: %s (%s) for request %s", offer.id, m.provider_id,
                 m.native_state, inst.request_id)
        return self.rt.store.move_instance(inst.request_id, I.BOOTING, self.clock(),
                                           f"launched ({m.native_state or m.state.value})",
                                           provider_id=m.provider_id)

    def _give_back(self, inst: Instance, provider: Provider, m: CloudMachine,
                   problem: str) -> Instance | None:
        """A machine launched whose agent can never join: terminate it and fail its record
        (if terminating fails, the record says BOOTING and the lifecycle reaps it)."""
        try:
            provider.terminate([m.provider_id])
        except ProviderError as e:
            log.error("launch %s: %s; terminating %s failed (%s): it is given back after "
                      "its boot timeout", inst.request_id, problem, m.provider_id, e)
            return self.rt.store.move_instance(inst.request_id, I.BOOTING, self.clock(),
                                               problem, provider_id=m.provider_id)
        self.counts["terminated"] += 1
        self.metrics.launch_failed(inst.provider, "agent-cannot-join")
        log.error("launch %s: %s; machine %s given back", inst.request_id, problem,
                  m.provider_id)
        return self.rt.store.move_instance(inst.request_id, I.FAILED, self.clock(),
                                           f"{problem}; the machine was given back",
                                           provider_id=m.provider_id)

    # -- terminate -------------------------------------------------------------------------

    def terminate(self, ids: Sequence[str], reason: str) -> int:
        """Give back the machines of these instances (provider or request ids); each record
        becomes TERMINATED. Returns how many records moved."""
        wanted = set(ids)
        moved = 0
        for inst in self.rt.store.instances(live_only=True):
            if inst.provider_id in wanted or inst.request_id in wanted:
                moved += self._terminate(inst, reason)
        return moved

    def _terminate(self, inst: Instance, reason: str) -> int:
        provider = self.provider(inst.provider)
        pid = inst.provider_id
        if not pid:  # (not recorded yet: its tags find it)
            pid = next((m.provider_id for m in provider.instances().values()
                        if m.request_id == inst.request_id), "")
        if pid:
            provider.terminate([pid])
        self.counts["terminated"] += 1
        done = self.rt.store.move_instance(inst.request_id, I.TERMINATED, self.clock(), reason,
                                           **({"provider_id": pid} if pid else {}))
        return int(done is not None and done.state is I.TERMINATED)

    # -- the lifecycle ---------------------------------------------------------------------

    def listings(self) -> dict[str, dict[str, CloudMachine]]:
        """Each configured provider's machines; a provider whose listing fails is left out
        (and said once a pass)."""
        out = {}
        for name in self.settings:
            try:
                out[name] = self.provider(name).instances()
            except (ProviderError, OSError) as e:
                log.warning("cannot list the machines of provider %s (%s); judged next pass",
                            name, e)
        return out

    def reconcile(self) -> Counter[str]:
        """One lifecycle pass (broker/cloud/lifecycle.py) and, now and then, the offers published.
        Returns what it did, by counter."""
        store, now = self.rt.store, self.clock()
        if now - self._offers_at >= OFFERS_EVERY_S:
            self.publish_offers(now)
        machines = self.listings()
        records = store.instances()
        nodes = store.nodes()
        held = store.allocations([n.id for n in nodes])
        busy = {n: len(gpus) for n, gpus in held.items() if gpus}
        timeouts = {n: Timeouts(c.boot_timeout_s, c.idle_timeout_s)
                    for n, c in self.settings.items()}
        result = decide(now, [r for r in records if not r.ended], machines, nodes, busy,
                        timeouts, self._idle_since, frozenset(r.request_id for r in records),
                        self._serves, self._low_since,
                        lambda nid: self._leaving(held.get(nid, {})))
        self._idle_since, self._low_since = result.idle_since, result.low_since
        done: Counter[str] = Counter()
        reaped: Counter[str] = Counter()  # orphans terminated, by provider
        for step in result.steps:
            try:
                if self._carry_out(step, now):
                    done[step.count] += 1
                    reaped[step.provider] += step.count == "orphans"
            except ProviderError as e:
                log.warning("%s %s: %s failed (%s); tried again next pass", step.provider,
                            step.request_id or step.terminate, step.count, e)
        self.metrics.observe_orphans(sum(s.count == "orphans" for s in result.steps), +reaped)
        done["forgotten"] += self._forget_nodes(records, nodes, now)
        # (the users of ended machines: the registrar deletes them, broker/security/registrar)
        acc = accrue_store(store, budget_book(store), now)  # the ledger (broker/money/ledger.py)
        done["settled"] += acc.settled
        done = +done  # (no zero counts)
        if done:
            log.info("lifecycle: %s", ", ".join(f"{k} {v}" for k, v in sorted(done.items())))
        self.counts.update(done)
        return done

    def _forget_nodes(self, records: Sequence[Instance], nodes: Sequence[Node],
                      now: float) -> int:
        """Drop the nodes of machines given back (they never return) once they have been
        DOWN for FORGET_AFTER_S (`spillway nodes` shows them DOWN meanwhile)."""
        ended = {r.provider_id for r in records if r.ended and r.provider_id}
        return sum(self.rt.store.forget_node(n.id) for n in nodes
                   if n.instance_id in ended and n.state is NodeState.DOWN
                   and now - n.lease_expires > FORGET_AFTER_S)

    def _serves(self, rec: Instance) -> bool:
        """Is a job ``rec`` was launched for still pending, or running on its node?"""
        for job_id in rec.for_jobs:
            try:
                job = self.rt.store.get(job_id)
            except JobNotFound:
                continue
            if job.state is JobState.PENDING or (job.state in ACTIVE
                                                 and rec.node_id in job.node_ids):
                return True
        return False

    def _leaving(self, holders: Mapping[str, str]) -> bool:
        """Is every job holding these GPUs ("job:attempt") stopping to leave the machine (to
        move to spot, or home to on-prem)?"""
        jobs = {v.split(":")[0] for v in holders.values()}
        for job_id in jobs:
            try:
                job = self.rt.store.get(job_id)
            except JobNotFound:
                return False
            stop = job.history[-1] if job.history else None
            if job.state is not JobState.STOPPING or stop is None \
                    or stop.kind not in LEAVES_MACHINE:
                return False
        return bool(jobs)

    def _carry_out(self, step: Step, now: float) -> bool:
        """Do one step; False if it was left for later (a launch sent again lately)."""
        store = self.rt.store
        if step.resend:
            if now - self._resent.get(step.request_id, -1e18) < RESEND_AFTER_S:
                return False
            inst = store.instance(step.request_id)
            if inst is None or inst.state is not I.REQUESTED:
                return False
            self._resent[step.request_id] = now
            commands.launch(self.rt.celery, inst.offer_id, 1, inst.request_id, inst.for_jobs)
            log.warning("launch %s sent again: %s", step.request_id, step.reason)
            return True
        if step.drain:
            store.set_node_state(step.drain, NodeState.DRAINING, by=IDLE_DRAIN)
        if step.terminate:
            self.provider(step.provider).terminate([step.terminate])
            log.warning("terminated %s %s: %s", step.provider, step.terminate, step.reason)
        if step.move is not None and step.request_id:
            changes = {k: v for k, v in (("provider_id", step.provider_id),
                                         ("node_id", step.node_id)) if v}
            moved = store.move_instance(step.request_id, step.move, now, step.reason, **changes)
            self._count_move(step, moved, now)
        if step.block and step.request_id:
            inst = store.instance(step.request_id)
            cfg = self.settings.get(step.provider)
            if inst is not None and cfg is not None:
                store.block(block_key_of(inst.offer_id), now + cfg.cooldown_s, step.reason)
        return True

    def _count_move(self, step: Step, moved: Instance | None, now: float) -> None:
        """A lifecycle move this pass made: a machine's boot time when it became READY, a
        failure when one never launched or never registered."""
        if moved is None or moved.state is not step.move:
            return
        if moved.state is I.READY and moved.ready_at == now:
            self.metrics.booted(moved.provider, now - moved.requested_at)
        elif moved.state is I.FAILED and moved.ended_at == now:
            code = "boot-timeout" if step.count == "boot_timeouts" else "not-launched"
            self.metrics.launch_failed(moved.provider, code)

    def publish_offers(self, now: float) -> None:
        offers: list[Offer] = []
        for name in self.settings:
            try:
                offers += self.provider(name).offers(Resources())
            except ProviderError as e:
                log.warning("cannot read the offers of provider %s (%s)", name, e)
        self.rt.store.publish_offers(offers, now)
        self._offers_at = now
