"""Phases 2 and 3 of the cycle: walk the ordered queue once, admit, place, reserve, backfill.

In queue order, each job is admitted (within its team's GPU cap for its class,
policies/order/class_caps.py, then by the ``admit`` policy), checked for feasibility, and
placed on free capacity (the ``place`` policy). The first job that cannot be placed is the
*head*: the ``reserve`` policy gives it a reservation (EASY backfill) or, in strict order,
makes everyone behind it wait; the evictors then plan what must happen before backfill
(defragmentation moves keep the GPUs they land on). A later job starts only if it does not
delay the reservation: it ends before the reservation starts, or it uses only GPUs the head
will not need (the reservation's cap), or an evictor lets it use the reserved GPUs until the
reservation is due (scavenging). Jobs of a request shape that already failed behind the head
fail alike without another search. A reserve policy that protects some jobs behind the head
(``Reserver.protects``, ``easy-deadline``) gives each of them a reservation of its own (a
guard) when it is blocked; a later job that would outlive a guard's start may not take the
GPUs the guard needs.

Machines rented for jobs serve them first: before the walk, a job that a cloud machine now
up was launched for (``Instance.for_jobs``) starts there if it fits, whatever its place in
the queue, and a gang still waiting for the rest of its machines keeps the GPUs of those up.
Otherwise a job ahead of it takes the machine, the job it was rented for rents again, and so
on down the queue until its SLA is lost (Slurm allocates a job the nodes it powers up, as
SkyPilot and Kueue's provisioning requests bind theirs). Without instances nothing changes.

Fast path, in the same loop: once the head is blocked and no GPU is free (or the order is
strict), the rest of the queue waits in one step; only jobs that need no GPU are still tried.
"""

from __future__ import annotations

from dataclasses import replace

from broker.model import Allocation, InstanceState, Job, Reason
from broker.model.fit import offer_could_hold
from policies import reasons
from policies.burst.offers import BOOTING
from policies.cycle import Cycle, deciding, each_alone
from policies.order.class_caps import over_cap
from policies.place.backfill import guard, guards_allow, outlived
from policies.place.capacity import Shadow
from policies.registry import register


def place_queue(cycle: Cycle) -> None:
    """Place, reserve and backfill over ``cycle.queue``, recording starts and reasons."""
    queue: list[Job] = cycle.queue  # type: ignore[attr-defined]
    for evictor in cycle.evictors:
        evictor.before_place(cycle)
    if cycle.snap.instances:
        served = own_machines_first(cycle, queue)
        if served:
            queue = [j for j in queue if j.id not in served]
    index, strict = cycle.index, cycle.reserver.strict
    protecting = cycle.reserver.protecting  # guards for some jobs behind the head
    failed: dict[tuple[object, ...], Reason] = {}  # request shape -> why it failed
    head_blocked = False
    for pos, job in enumerate(queue):
        if head_blocked and (strict or index.free_devices == 0):
            _wait_behind(cycle, queue[pos:], strict, full=index.free_devices == 0)
            return
        try:  # (a job a policy fails on is set aside: policies/cycle.py deciding)
            refusal = admitted(cycle, job)
            if refusal is not None:
                cycle.pending[job.id] = refusal
                continue
            res = job.res
            if not index.feasible_ever(res) and not _an_offer_holds(cycle, job):
                cycle.pending[job.id] = reasons.infeasible(res)
                continue
            long = False
            if not res.gpus or index.free_devices:  # (else nothing to try: the head waits)
                long = cycle.shadow is not None and not cycle.shadow.allows(
                    cycle.now, cycle.estimate(job))
                shape: tuple[object, ...] = (res.key, job.spec.sites,
                                             long and _may_use_reserved(cycle, job))
                over = outlived(cycle, job) if cycle.guards else []
                if cycle.guards:  # (the outcome also depends on the guards it would outlive)
                    shape = (*shape, tuple(id(g) for g in over))
                if shape in failed:
                    cycle.pending[job.id] = failed[shape]
                    cycle.blocked.append(job)
                    if protecting:
                        guard(cycle, job, long)
                    continue
                allocs = _place(cycle, job, long, over)
                if allocs is not None:
                    cycle.start(job, allocs, long)
                    continue
            cycle.blocked.append(job)
            if not head_blocked:
                head_blocked = True
                if not strict:
                    cycle.shadow = cycle.reserve(job)
                cycle.pending[job.id] = reasons.head(cycle, res)
                for evictor in cycle.evictors:
                    evictor.head_blocked(cycle, job)
                continue
            failed[shape] = cycle.pending[job.id] = reasons.blocked(cycle, job, long)
            if protecting:
                guard(cycle, job, long)
        except Exception as e:
            if not cycle.fail(job, e):
                raise


def admitted(cycle: Cycle, job: Job) -> Reason | None:
    """Why ``job`` is not admitted now (its team's cap for its class, then the ``admit``
    policy's refusal); None if it is."""
    over = over_cap(cycle, job)
    if over is not None:
        return over
    refusal = cycle.admit(cycle, job)
    return None if refusal is None else Reason(refusal, f"not admitted: {refusal}")


def own_machines_first(cycle: Cycle, queue: list[Job]) -> set[str]:
    """Start each job of ``queue`` (in its order) on the cloud machines up now that were
    launched for it, where it fits; a gang with some of its machines still booting keeps the
    GPUs of those up (no other job starts there this cycle; it walks the queue as the
    others). The ids started."""
    mine: dict[str, list[str]] = {}  # job id -> nodes of ready machines launched for it
    booting: set[str] = set()  # jobs with a machine launched for them still coming up
    for inst in cycle.snap.instances:
        if inst.state is InstanceState.READY and inst.node_id in cycle.index.nodes:
            for jid in inst.for_jobs:
                mine.setdefault(jid, []).append(inst.node_id)
        elif inst.state in BOOTING:
            booting.update(inst.for_jobs)
    done: set[str] = set()
    if not mine:
        return done
    index = cycle.index
    for job in queue:
        nodes = mine.get(job.id)
        if nodes is None:
            continue
        with deciding(cycle, job):
            if admitted(cycle, job) is not None:
                continue
            allocs = index.find(job.res, job.spec.sites, only=nodes)
            if allocs is not None:
                cycle.start(job, allocs, False)
                done.add(job.id)
            elif job.res.nodes > 1 and job.id in booting:
                one = replace(job.res, nodes=1)
                for nid in nodes[: job.res.nodes]:  # its nodes up so far: kept for it
                    part = index.find(one, job.spec.sites, only=(nid,))
                    if part is not None:
                        index.take(part, one)
    return done


def _an_offer_holds(cycle: Cycle, job: Job) -> bool:
    """Could a cloud offer hold the job? Then it is feasible, even if no live node could: the
    burst policy decides whether to rent."""
    return offer_could_hold(job.res, job.spec.sites, cycle.snap.offers)


def _may_use_reserved(cycle: Cycle, job: Job) -> object:
    """For the shape cache: a long job's outcome also depends on whether it may use the
    reserved GPUs (scavenging)."""
    return "scavenge" if any(e.may_use_reserved(cycle, job) for e in cycle.evictors) else True


def _place(cycle: Cycle, job: Job, long: bool, over: list[Shadow]
           ) -> tuple[Allocation, ...] | None:
    """Where ``job`` starts now, or None; ``over``: the guards it would outlive."""
    end = cycle.now + min(cycle.estimate(job), 1e9)
    allocs = _place_around_head(cycle, job, long, end)
    if allocs is None or not over or guards_allow(cycle, over, allocs):
        return allocs
    # it would take GPUs a guard needs: only the nodes where each guard leaves it room
    need = job.res.gpus
    only = [nid for nid in cycle.index.nodes if all(g.cap.get(nid, need) >= need for g in over)]
    sh = cycle.shadow if long else None
    allocs = cycle.index.find(job.res, job.spec.sites, sh.cap if sh else None,
                              sh.kind if sh else None, cycle.horizon, end, only=only)
    return allocs if allocs is not None and guards_allow(cycle, over, allocs) else None


def _place_around_head(cycle: Cycle, job: Job, long: bool, end: float
                       ) -> tuple[Allocation, ...] | None:
    sh = cycle.shadow
    if sh is not None and not long and cycle.placer.packs_around_reservation:
        # a job that ends before the reservation starts goes first into the reserved nodes'
        # idle GPUs, keeping the other nodes for longer jobs
        inside = cycle.index.find(job.res, job.spec.sites, only=sh.node_set)
        if inside is not None:
            return inside
    if sh is None or not long:
        return cycle.placer.place(cycle, job, end)
    # it would outlive the reservation: only the GPUs the head will not need, or (if an
    # evictor allows it) the reserved GPUs until the reservation is due
    allocs = cycle.index.find(job.res, job.spec.sites, sh.cap, sh.kind, cycle.horizon, end)
    for evictor in cycle.evictors:
        if allocs is not None:
            break
        allocs = evictor.use_reserved(cycle, job)
    return allocs


def _wait_behind(cycle: Cycle, rest: list[Job], strict: bool, full: bool) -> None:
    """The head is blocked and nothing behind it can start on GPUs: the rest waits at once
    (if that raises: each job alone, those it raises on set aside)."""
    try:
        _wait_all(cycle, rest, strict, full)
    except Exception as e:
        each_alone(cycle, rest, lambda jobs: _wait_all(cycle, jobs, strict, full), e)


def _wait_all(cycle: Cycle, rest: list[Job], strict: bool, full: bool) -> None:
    index = cycle.index
    wait = reasons.FIFO if strict else reasons.FULL
    if not full:  # strict order with GPUs free: every later job waits for the head
        cycle.pending.update((j.id, reasons.FIFO) if index.feasible_ever(j.res)
                             or _an_offer_holds(cycle, j)
                             else (j.id, reasons.infeasible(j.res)) for j in rest)
        cycle.blocked.extend(rest)
        return
    offers = bool(cycle.snap.offers)

    def feasible(j: Job) -> bool:
        return index.feasible_ever(j.res) or (offers and _an_offer_holds(cycle, j))

    known = {} if offers else index.feasible_memo  # (inlined: long tails)
    ok = [j for j in rest if j.res.gpus and (known.get(j.res.key) or feasible(j))]
    cycle.pending.update(dict.fromkeys([j.id for j in ok], wait))
    cycle.blocked.extend(ok)
    if len(ok) == len(rest):
        return
    for j in rest:  # jobs that need no GPU may still start (not in strict order)
        if j.res.gpus and feasible(j):
            continue
        if not feasible(j):
            cycle.pending[j.id] = reasons.infeasible(j.res)
            continue
        allocs = None if strict else cycle.placer.place(cycle, j, cycle.now)
        if allocs is not None:
            cycle.start(j, allocs, False)
        else:
            cycle.pending[j.id] = wait
            cycle.blocked.append(j)


@register("burst", "none")
def no_burst(cycle: Cycle) -> None:
    """Rent nothing (the burst policies land with the cloud sites)."""
    del cycle


@register("defer", "none")
def no_defer(cycle: Cycle) -> None:
    """Hold nothing back (carbon- and price-aware deferral lands later)."""
    del cycle
