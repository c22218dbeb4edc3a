"""The scheduling cycle: ``plan = run_cycle(snapshot, policies, now)``. Pure: no I/O, no clock."""

from __future__ import annotations

from collections import defaultdict

from broker.model import Job, Reason, Resources
from broker.plan import Plan, Snapshot, Start
from policies import ordering as _ordering  # noqa: F401  (registers the built-in policies)
from policies import placement as _placement  # noqa: F401
from policies.placement import FreeIndex
from policies.registry import PolicySet


def _shape(res: Resources, sites: tuple[str, ...]) -> tuple[object, ...]:
    return (res.gpus, res.gpu_types, res.min_gpu_memory_gb, res.mig_profile, res.cpus,
            res.memory_gb, res.nodes, sites)


def _used_cpu_mem(active: tuple[Job, ...]) -> dict[str, tuple[float, float]]:
    used: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for job in active:
        done = {r for r, _ in job.parts_exited}
        for a in job.allocations:
            if a.rank not in done:
                used[a.node_id][0] += job.spec.cpus
                used[a.node_id][1] += job.spec.memory_gb
    return {k: (v[0], v[1]) for k, v in used.items()}


def run_cycle(snapshot: Snapshot, policies: PolicySet | None = None,
              now: float | None = None) -> Plan:
    """One scheduling pass over a snapshot.

    1 order the pending jobs   2 admit (quotas, budgets)   3 place on free capacity
    4 backfill (later)         5 preempt (later)           6 burst (later)
    7 defer for carbon (later) 8 a reason for every job left pending
    """
    policies = policies or PolicySet()
    now = snapshot.now if now is None else now
    order, admit, place = (policies.resolve(r) for r in ("order", "admit", "place"))
    index = FreeIndex(snapshot.nodes, {k: dict(v) for k, v in snapshot.allocated.items()},
                      _used_cpu_mem(snapshot.active))

    queue: list[Job] = order(snapshot, snapshot.pending)  # 1
    starts: list[Start] = []
    pending: dict[str, Reason] = {}
    blocked_shapes: dict[tuple[object, ...], Reason] = {}  # shape -> reason for later twins
    blocked_kinds: set[object] = set()  # device kinds a higher-ranked waiting job wants
    for job in queue:
        refusal = admit(snapshot, job)  # 2
        if refusal is not None:
            pending[job.id] = Reason(refusal, f"not admitted: {refusal}")
            continue
        res = job.spec.resources
        shape = _shape(res, job.spec.sites)
        twin = blocked_shapes.get(shape)
        if twin is not None:  # an identical request already failed this cycle
            pending[job.id] = twin
            continue
        allocs = place(index, job)  # 3
        if allocs is None:
            reason = pending[job.id] = _blocked_reason(job, res, index, blocked_kinds)
            if reason.code != "NoFeasibleNode":  # an impossible job blocks nobody
                blocked_kinds.update(index.wanted(res))
            blocked_shapes[shape] = _blocked_reason(job, res, index, blocked_kinds)
            continue
        index.take(allocs, res)
        starts.append(Start(job.id, job.attempt, job.version, allocs))
    # 4-7: backfill, preemption, burst and carbon deferral plug in here.
    return Plan(starts=tuple(starts), pending=pending)  # 8


def _blocked_reason(job: Job, res: Resources, index: FreeIndex,
                    blocked_kinds: set[object]) -> Reason:
    if not index.feasible_ever(res):
        return Reason(
            "NoFeasibleNode",
            f"no live node has {res.gpus} free-able GPU(s) of {_types(res)}"
            + (f" on {res.nodes} nodes" if res.nodes > 1 else "")
            + "; check `spillway nodes` and the job's gpu_types / min_gpu_memory_gb",
        )
    kinds = set(index.wanted(res))
    if kinds & blocked_kinds:
        return Reason("Priority", "waiting behind higher-priority or earlier jobs that need the "
                                  f"same GPUs ({_types(res)})")
    return Reason("Resources", f"waiting for {res.gpus} GPU(s) of {_types(res)} to free up"
                               + (f" on {res.nodes} nodes" if res.nodes > 1 else ""))


def _types(res: Resources) -> str:
    what = "/".join(res.gpu_types) if res.gpu_types else "any type"
    if res.mig_profile:
        what = f"MIG {res.mig_profile} ({what})"
    if res.min_gpu_memory_gb:
        what += f", >= {res.min_gpu_memory_gb:g} GB"
    return what
