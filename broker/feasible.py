"""Submit-time check: could any registered node (up or down), or a cloud offer, ever hold a job?

A request no part of the cluster could hold would wait forever (Slurm refuses such a job at
submit, as no partition can satisfy it). :func:`problems` says which field asks too much and
what the cluster has; the client raises them as a :class:`~broker.errors.SpecError`, unless
``hold_if_infeasible`` (configuration key or ``submit --hold-if-infeasible``) keeps the job.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence

from broker.errors import FieldError
from broker.gpus import memory_of
from broker.model import JobSpec, Node, Resources
from broker.model.cloud import Offer
from broker.model.fit import Kind, kind_of, offer_could_hold, site_allows, wanted_kinds

HOLD_HINT = ("submit with --hold-if-infeasible (client: hold_if_infeasible=True, or "
             "hold_if_infeasible: true in the configuration) to queue it anyway")


def _host_ok(node: Node, res: Resources) -> bool:
    """CPUs and memory (0 on a node: not accounted, as in the placement)."""
    return ((not node.cpus or node.cpus >= res.cpus)
            and (not node.memory_gb or node.memory_gb >= res.memory_gb))


def _kind_name(kind: Kind) -> str:
    model, mig = kind
    return f"{model} MIG {mig}" if mig else model


def inventory(nodes: Iterable[Node]) -> str:
    """What the cluster has, in a few words: '2 nodes: 1 x 8 H100-80GB, 1 x 4 A100-40GB'."""
    nodes = list(nodes)
    shapes: Counter[str] = Counter()
    for node in nodes:
        per = Counter(_kind_name(kind_of(g)) for g in node.allocatable)
        gpus = " + ".join(f"{n} {k}" for k, n in sorted(per.items())) or "no GPU"
        host = []
        if node.cpus:
            host.append(f"{node.cpus:g} CPUs")
        if node.memory_gb:
            host.append(f"{node.memory_gb:g} GB")
        shapes[gpus + (f" ({', '.join(host)})" if host else "")] += 1
    listed = ", ".join(f"{n} x {shape}" for shape, n in sorted(shapes.items()))
    return f"{len(nodes)} node{'s' if len(nodes) != 1 else ''}: {listed}"


def problems(spec: JobSpec, nodes: Sequence[Node],
             offers: Sequence[Offer] = ()) -> list[FieldError]:
    """Why no registered node (up or down) and no offer could ever hold ``spec``, as field
    errors naming the field that asks too much and what the cluster has; [] if one could."""
    if offer_could_hold(spec.resources, spec.sites, offers):
        return []
    res = spec.resources
    if not nodes:
        return [FieldError("nodes", "no node is registered, so nothing could hold this job; "
                                    "start a worker (`spillway worker` or `spillway up`) or "
                                    + HOLD_HINT)]
    have = inventory(nodes)
    placed = [n for n in nodes if site_allows(n.site, spec.sites)]
    if not placed:
        sites = sorted({n.site for n in nodes})
        return [FieldError("sites", f"no registered node is at {', '.join(spec.sites)}; the "
                                    f"cluster's nodes are at {', '.join(sites)} ({have})")]
    hosts = [n for n in placed if _host_ok(n, res)]
    if len(hosts) < res.nodes:
        for fld, need, size in (("cpus", res.cpus, lambda n: n.cpus),
                                ("memory_gb", res.memory_gb, lambda n: n.memory_gb)):
            fit = [n for n in placed if not size(n) or size(n) >= need]
            if len(fit) < min(res.nodes, len(placed)):
                most = max(size(n) for n in placed)
                return [FieldError(fld, f"asks {need:g} per node; the most a registered node "
                                        f"has is {most:g} ({have})")]
        return [FieldError("nodes", f"asks {res.nodes} nodes; {len(hosts)} registered node(s) "
                                    f"could hold a part ({have})")]
    if res.gpus == 0:
        return []
    counts: list[Counter[Kind]] = [Counter(kind_of(g) for g in n.allocatable) for n in hosts]
    kinds = set().union(*counts)
    wanted = wanted_kinds(res, kinds)
    if not wanted:
        return [_kind_problem(res, kinds, have)]
    most = max(c[k] for c in counts for k in wanted)
    what = ", ".join(_kind_name(k) for k in wanted)
    if most < res.gpus:
        return [FieldError("gpus", f"asks {res.gpus} GPUs per node; the most a registered node "
                                   f"has of {what} is {most} ({have})")]
    enough = max(sum(1 for c in counts if c[k] >= res.gpus) for k in wanted)
    if enough < res.nodes:
        return [FieldError("nodes", f"asks {res.nodes} nodes with {res.gpus} GPUs of one model "
                                    f"each; {enough} registered node(s) have that ({have})")]
    return []


def _kind_problem(res: Resources, kinds: set[Kind], have: str) -> FieldError:
    """No device kind on the cluster matches: name the first field that rules them all out."""
    if res.mig_profile:
        migs = sorted({m for _, m in kinds if m})
        if not any(m == res.mig_profile for _, m in kinds):
            return FieldError("mig_profile", f"no registered node has MIG {res.mig_profile} "
                                             f"instances; the cluster has "
                                             f"{', '.join(migs) or 'no MIG instance'} ({have})")
    whole = {(m, g) for m, g in kinds if g == res.mig_profile}
    if res.gpu_types and not wanted_kinds(
            Resources(gpus=res.gpus, gpu_types=res.gpu_types, mig_profile=res.mig_profile),
            whole):
        return FieldError("gpu_types", f"no registered node has {'/'.join(res.gpu_types)} "
                                       f"GPUs; the cluster has {have}")
    best = max((memory_of(m) for m, _ in whole), default=0)
    return FieldError("min_gpu_memory_gb", f"asks {res.min_gpu_memory_gb:g} GB per GPU; the "
                                           f"largest a registered node has is {best} GB "
                                           f"({have})")
