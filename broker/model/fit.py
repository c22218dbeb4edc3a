"""Which devices satisfy a request, and whether a set of nodes could ever hold a job.

Facts of the vocabulary, not policy: placement (policies/place/placement.py) indexes free devices by
these kinds, and the simulator and submit-time checks ask :func:`could_hold`.
"""

from __future__ import annotations

from collections.abc import Iterable

from broker.model.cloud import Offer
from broker.model.gpus import memory_of, type_matches
from broker.model.node import Gpu, Node, NodeState
from broker.model.spec import Resources

Kind = tuple[str, "str | None"]  # (GPU model, MIG profile or None for a whole GPU)


def kind_of(gpu: Gpu) -> Kind:
    return (gpu.model, gpu.mig_profile)


def wanted_kinds(res: Resources, kinds: Iterable[Kind]) -> list[Kind]:
    """The device kinds that satisfy a request, among ``kinds``."""
    out = []
    for model, mig in kinds:
        if mig != res.mig_profile:
            continue
        if res.gpu_types and not any(type_matches(model, t) for t in res.gpu_types):
            continue
        if mig is None and res.min_gpu_memory_gb and memory_of(model) < res.min_gpu_memory_gb:
            continue
        out.append((model, mig))
    return sorted(out)


def site_allows(site: str, sites: tuple[str, ...]) -> bool:
    """May a job restricted to ``sites`` run on a node of ``site``? A spot site
    (``provider:region[:zone]:spot``) is admitted by ``spot``, any other cloud site by
    ``cloud`` (:attr:`broker.model.Site.kind`)."""
    if site in sites:
        return True
    if site == "onprem":
        return False
    return ("spot" if site.endswith(":spot") else "cloud") in sites


def offer_could_hold(res: Resources, sites: tuple[str, ...], offers: Iterable[Offer]) -> bool:
    """Could a cloud offer hold the job, one instance a node? (Never for an on-prem-only job.)"""
    offers = list(offers)
    if not offers or sites == ("onprem",):
        return False
    kinds = {(o.gpu_model, None) for o in offers if o.gpu_count >= res.gpus}
    return res.gpus == 0 or bool(wanted_kinds(res, kinds))


def could_hold(nodes: Iterable[Node], res: Resources) -> bool:
    """Could ``res`` fit on these nodes if they were all empty? (A job that needs no GPU: if
    one of them is ready.)"""
    per_kind: dict[Kind, list[int]] = {}
    ready = False
    for node in nodes:
        ready = ready or node.state is NodeState.READY
        counts: dict[Kind, int] = {}
        for gpu in node.allocatable:
            k = kind_of(gpu)
            counts[k] = counts.get(k, 0) + 1
        for k, n in counts.items():
            per_kind.setdefault(k, []).append(n)
    if res.gpus == 0:
        return ready
    return any(sum(1 for n in per_kind[k] if n >= res.gpus) >= res.nodes
               for k in wanted_kinds(res, per_kind))
