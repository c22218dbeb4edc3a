"""Small builders for nodes, jobs and snapshots used by table-driven tests."""

from __future__ import annotations

from broker.config.core import DEFAULT_CLASSES
from broker.cycle.plan import Snapshot
from broker.model import Allocation, Gpu, Job, JobSpec, Node, NodeState
from broker.model.state import JobState


def node(node_id: str, count: int = 8, model: str = "A100-80GB", *, cpus: float = 0,
         memory_gb: float = 0, state: NodeState = NodeState.READY, site: str = "onprem",
         mig: dict[int, list[str]] | None = None) -> Node:
    """A node with ``count`` GPUs; ``mig`` maps a GPU index to the MIG profiles it is split into."""
    mem = float(model.rsplit("-", 1)[-1].removesuffix("GB") or 0)
    gpus: list[Gpu] = []
    for i in range(count):
        split = (mig or {}).get(i)
        gpus.append(Gpu(f"GPU-{node_id}-{i}", i, model, mem, mig_enabled=bool(split)))
        for n, profile in enumerate(split or []):
            gpus.append(Gpu(f"MIG-{node_id}-{i}-{n}", i, model, mem, mig_profile=profile,
                            parent=f"GPU-{node_id}-{i}"))
    return Node(node_id, tuple(gpus), site=site, cpus=cpus, memory_gb=memory_gb, state=state,
                lease_expires=1e12)


def job(job_id: str, gpus: int = 1, *, priority: str = "normal", submitted: float = 0.0,
        state: JobState = JobState.PENDING, allocations: tuple[Allocation, ...] = (),
        **spec: object) -> Job:
    s = JobSpec(command="true", gpus=gpus, priority=priority, team="t", **spec)  # type: ignore[arg-type]
    return Job(job_id, s, state, submitted, allocations=allocations)


def snapshot(nodes: list[Node], pending: list[Job], active: list[Job] = (),  # type: ignore[assignment]
             now: float = 100.0) -> Snapshot:
    allocated: dict[str, dict[str, str]] = {n.id: {} for n in nodes}
    for j in active:
        for a in j.allocations:
            for g in a.gpu_ids:
                allocated.setdefault(a.node_id, {})[g] = f"{j.id}:{j.attempt}"
    return Snapshot(now, tuple(pending), tuple(active), tuple(nodes), allocated, DEFAULT_CLASSES)
