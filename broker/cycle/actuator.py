"""Apply a Plan: compare-and-set writes to the store, then commands (broker/bus/commands.py).

Safe to run twice on the same Plan: the store skips starts whose job already moved on, so a
start command is only sent for what this call actually changed.

Launches are first recorded in the store as REQUESTED instances, one per machine (under the
leader's fencing token, idempotent by request id: a Plan applied twice records them once),
then sent on the ``provision`` queue, as terminations are. A cluster with no cloud provider
configured (no ``providers:`` in its config) cannot carry them out: a Plan that asks for them
is refused whole, before anything is written, rather than applied without them.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from broker.bus import commands
from broker.bus.runtime import Runtime
from broker.config.core import Config
from broker.cycle.plan import Applied, Launch, Plan
from broker.errors import ConfigError
from broker.model import Instance, InstanceState, StateChange
from broker.money.ledger import Machine, payers_of, reserve_plan
from broker.store.budgets import budget_book
from broker.store.instances import request_ids


class NoProvisioner(ConfigError):
    """A Plan asks for cloud capacity (launches or terminations) but no cloud provider is
    configured. Nothing of the Plan was applied."""

    def __init__(self, launches: int, instances: int, terminations: int) -> None:
        self.launches, self.instances, self.terminations = launches, instances, terminations
        asks = []
        if launches:
            asks.append(f"launch {instances} instance(s) in {launches} request(s)")
        if terminations:
            asks.append(f"terminate {terminations} instance(s)")
        super().__init__(
            f"the plan asks to {' and to '.join(asks)}, but no cloud provider is configured; "
            "configure `providers:` in the config file, or select a policy that does not "
            "burst. Nothing of this plan was applied"
        )


def provisioning_configured(config: Config) -> bool:
    """Whether the config names cloud providers (the ``providers:`` key of the file)."""
    return bool(config.providers)


def check_provisioning(plan: Plan, config: Config) -> None:
    """NoProvisioner if ``plan`` launches or terminates instances and nothing could."""
    if (plan.launches or plan.terminations) and not provisioning_configured(config):
        raise NoProvisioner(len(plan.launches), sum(x.count for x in plan.launches),
                            sum(len(x.instance_ids) for x in plan.terminations))


def apply_plan(rt: Runtime, plan: Plan) -> Applied:
    check_provisioning(plan, rt.config)  # before the store sees any of it
    # the teams' hard caps: each launch's expected cost reserved, atomically
    # (broker/money/ledger.py)
    plan = reserve_plan(budget_book(rt.store), plan, time.time(), _team_of(rt),
                        _machine_of(rt))
    applied = rt.store.apply(plan, now=time.time())
    send = sender(rt)
    if applied.started:
        send(commands.start_jobs, rt.celery, applied.started)
    grace = {p.job_id: p.grace_s for p in plan.preemptions}
    for job in applied.stopping:  # each with the grace its preemption asked for
        send(commands.stop_jobs, rt.celery, [job], grace.get(job.id, rt.config.grace_s))
    for launch in plan.launches:
        request_launch(rt, launch)
    for term in plan.terminations:
        commands.terminate(rt.celery, term.instance_ids, term.reason)
    return applied


def sender(rt: Runtime) -> Callable[..., object]:
    """How the start and stop commands of an applied Plan leave: through the runtime's
    outbox, whose thread publishes them while the next cycle runs (the leading scheduler),
    or at once."""
    if rt.outbox is not None:
        return rt.outbox.post
    return lambda fn, *args: fn(*args)


def _team_of(rt: Runtime) -> Callable[[str], str]:
    def team(job_id: str) -> str:
        job = rt.store.get_many([job_id])[0]
        return job.team if job is not None else ""
    return team


def _machine_of(rt: Runtime) -> Callable[[str], Machine | None]:
    """Node id -> the rented machine it is: its request id and who it was launched for (team
    -> GPUs), read when first asked."""
    found: dict[str, Instance] | None = None

    def machine(node_id: str) -> Machine | None:
        nonlocal found
        if found is None:
            found = {i.node_id: i for i in rt.store.instances(live_only=True) if i.node_id}
        inst = found.get(node_id)
        if inst is None:
            return None
        return inst.request_id, payers_of(inst, {j.id: j for j in rt.store.get_many(
            list(inst.for_jobs)) if j is not None})
    return machine


def request_launch(rt: Runtime, launch: Launch, now: float | None = None) -> list[Instance]:
    """Record the launch's machines as REQUESTED instances (those not recorded yet), then send
    the launch on the ``provision`` queue. Returns the records this call created."""
    now = time.time() if now is None else now
    price = next((o.price_per_hour for o in rt.store.offers(now, include_blocked=True)
                  if o.id == launch.offer_id), 0.0)
    jobs = tuple(launch.for_jobs)
    why = (f"requested for {len(jobs)} job(s): {', '.join(jobs[:5])}"
           f"{', ...' if len(jobs) > 5 else ''}" if jobs else "requested by an operator")
    created = rt.store.record_instances([
        Instance(rid, launch.offer_id, requested_at=now, price_per_hour=price, for_jobs=jobs,
                 history=(StateChange(InstanceState.REQUESTED, now, why),))
        for rid in request_ids(launch.request_id, launch.count)])
    commands.launch(rt.celery, launch.offer_id, launch.count, launch.request_id,
                    launch.for_jobs)
    return created
