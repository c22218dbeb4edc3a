"""Submit-time check: could any registered node, or a cloud offer, ever hold a job?

A request no part of the cluster could hold would wait forever (Slurm refuses such a job at
submit, as no partition can satisfy it). :func:`problems` says which field asks too much and
what the cluster has; the client raises them as a :class:`~broker.errors.SpecError`, unless
``hold_if_infeasible`` (configuration key or ``submit --hold-if-infeasible``) keeps the job.

A node that is down still counts (it may come back) until it has been dead for
``node_forget_after_s``: then it is a ghost, and counting it would accept jobs that can never
run (:func:`counted`). A cloud offer counts only where the job may burst to it (its class may
burst, its ``sites`` allow the offer's market); where one could hold the job but may not, the
refusal says so and why (:func:`cloud_hint`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence

from broker.errors import FieldError
from broker.model import JobSpec, Node, PriorityClass, Resources
from broker.model.cloud import Market, Offer
from broker.model.fit import Kind, kind_of, site_allows, wanted_kinds
from broker.model.gpus import memory_of

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


def counted(nodes: Iterable[Node], now: float | None,
            forget_after_s: float | None) -> tuple[list[Node], list[Node]]:
    """(the nodes submit counts, the ghosts it does not): a node counts while alive or dead
    for less than ``forget_after_s`` (since its lease ran out); None for either: every node."""
    if now is None or forget_after_s is None:
        return list(nodes), []
    keep: list[Node] = []
    ghosts: list[Node] = []
    for node in nodes:
        (ghosts if now - node.lease_expires >= forget_after_s else keep).append(node)
    return keep, ghosts


def problems(spec: JobSpec, nodes: Sequence[Node], offers: Sequence[Offer] = (), *,
             classes: Sequence[PriorityClass] = (), now: float | None = None,
             forget_after_s: float | None = None) -> list[FieldError]:
    """Why no registered node and no cloud offer the job may burst to could ever hold
    ``spec``, as field errors naming the field that asks too much and what the cluster has;
    [] if one could. ``classes``: the configured classes (none given: the job's class is taken
    to burst); ``now`` and ``forget_after_s``: leave out nodes dead that long (ghosts)."""
    cls = next((c for c in classes if c.name == spec.priority), None) if classes else None
    holding = [o for o in offers if _offer_holds(spec.resources, o)]
    if any(_may_use(o, spec.sites, cls, classes) is None for o in holding):
        return []
    live, ghosts = counted(nodes, now, forget_after_s)
    found = _onprem_problems(spec, live)
    if not found:
        return []
    first, *rest = found
    if not live and ghosts:
        first = FieldError("nodes", "no node is alive, nor was one in the last "
                                    f"{forget_after_s:g}s, so nothing could hold this job; "
                                    "start a worker (`spillway worker` or `spillway up`) or "
                                    + HOLD_HINT)
    tail = cloud_hint(spec, holding, cls, classes) + _ghost_note(ghosts, forget_after_s)
    return [FieldError(first.field, first.problem + tail, first.allowed), *rest]


def _offer_holds(res: Resources, offer: Offer) -> bool:
    """Could one instance of ``offer`` hold one node of the job? (No MIG in the cloud.)"""
    if res.mig_profile is not None or offer.gpu_count < res.gpus:
        return False
    return res.gpus == 0 or bool(wanted_kinds(res, [(offer.gpu_model, None)]))


def _may_use(offer: Offer, sites: tuple[str, ...], cls: PriorityClass | None,
             classes: Sequence[PriorityClass]) -> str | None:
    """None if a job of class ``cls`` restricted to ``sites`` may burst to ``offer``, else why
    not, as the condition that would let it ('if ...')."""
    if classes and (cls is None or not cls.may_burst):
        may = ", ".join(c.name for c in classes if c.may_burst) or "none"
        name = cls.name if cls is not None else "?"
        return (f"if your class may burst: class {name!r} may not (classes that may: {may})")
    if offer.market is Market.SPOT:
        if cls is not None and not cls.spot_allowed:
            return f"if your class may use spot: class {cls.name!r} may not"
        if "spot" not in sites:
            return "if the job may run on spot machines: add spot to its sites"
        return None
    if "cloud" not in sites:
        return "if the job may run in the cloud: add cloud to its sites"
    return None


def cloud_hint(spec: JobSpec, holding: Sequence[Offer], cls: PriorityClass | None,
               classes: Sequence[PriorityClass]) -> str:
    """'; no registered node can, but cloud offer `gcp a2-megagpu-16g` can, if ...' for the
    cheapest offer that could hold the job it may not burst to ('' without one)."""
    if not holding:
        return ""
    best = min(holding, key=lambda o: (o.price_per_hour, o.id))
    why = _may_use(best, spec.sites, cls, classes) or ""
    return (f"; no registered node can, but cloud offer `{best.provider} {best.instance_type}` "
            f"({best.gpu_count} x {best.gpu_model}, {best.market.value}) can, {why}")


def _ghost_note(ghosts: Sequence[Node], forget_after_s: float | None) -> str:
    if not ghosts or forget_after_s is None:
        return ""
    ids = ", ".join(n.id for n in ghosts[:5]) + (", ..." if len(ghosts) > 5 else "")
    return (f" (not counted: {len(ghosts)} node(s) dead for more than {forget_after_s:g}s "
            f"(node_forget_after_s): {ids}; `spillway nodes --forget NODE` removes one)")


def _onprem_problems(spec: JobSpec, nodes: Sequence[Node]) -> list[FieldError]:
    """Why no node of ``nodes`` (up or down) could ever hold ``spec``; [] if one could."""
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
