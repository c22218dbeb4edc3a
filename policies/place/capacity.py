"""The free capacity a cycle places jobs on, and the reservation it honours there.

:class:`FreeIndex` indexes free devices by *kind* (GPU model, MIG profile or None) and by how
many of that kind a node has free, so a lookup is a few dictionary probes rather than a scan of
every node; best fit: the node left with the fewest free devices of that kind after placing the
job (policies/place/placement.py plays the place role with it). :class:`Shadow` is a
reservation being honoured during one cycle (policies/place/backfill.py makes them), and
:data:`Profile` when busy devices are expected back. These are the data of the cycle's state
(policies/cycle.py): this module imports no policy.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from broker.cycle.plan import Reservation
from broker.model import Allocation, Gpu, Node, NodeState, Resources
from broker.model.fit import Kind, kind_of, site_allows, wanted_kinds
from broker.model.speed import speed_of


@dataclass
class _NodeFree:
    node: Node
    devices: dict[Kind, list[Gpu]]
    cpus: float  # free CPUs (inf when the node does not account CPUs)
    mem: float


@dataclass(frozen=True)
class _Layout:
    """A node's devices by kind, in index order (what does not change from cycle to cycle)."""

    node: Node
    kinds: dict[str, Kind]  # GPU id -> kind
    devices: dict[Kind, tuple[Gpu, ...]]


def _layout(node: Node, layouts: dict[str, Any]) -> _Layout:
    """``node``'s layout, from ``layouts`` (node id -> layout; a cache kept across cycles,
    policies/cycle.py ``Memory``) while the node object is the same."""
    cached = layouts.get(node.id)
    if cached is not None and cached.node is node:
        return cached  # type: ignore[no-any-return]
    kinds: dict[str, Kind] = {}
    per_kind: dict[Kind, list[Gpu]] = defaultdict(list)
    for gpu in node.allocatable:
        kind = kinds[gpu.id] = kind_of(gpu)
        per_kind[kind].append(gpu)
    layout = _Layout(node, kinds, {k: tuple(sorted(v, key=lambda g: g.index))
                                   for k, v in per_kind.items()})
    if len(layouts) > 100_000:
        layouts.clear()
    layouts[node.id] = layout
    return layout


class FreeIndex:
    """Mutable view of free capacity for one cycle. ``take`` updates it as jobs are placed."""

    def __init__(self, nodes: Iterable[Node],
                 allocated: Mapping[str, Mapping[str, str]] | None = None,
                 used_cpu_mem: dict[str, tuple[float, float]] | None = None,
                 layouts: dict[str, Any] | None = None) -> None:
        allocated = allocated or {}
        layouts = {} if layouts is None else layouts
        used_cpu_mem = used_cpu_mem or {}
        self.nodes: dict[str, _NodeFree] = {}
        self.feasible_memo: dict[tuple[object, ...], bool] = {}  # keyed by Resources.key
        self._wanted: dict[tuple[object, ...], list[Kind]] = {}
        self._by_speed: dict[tuple[object, ...], list[Kind]] = {}
        self.total: dict[Kind, list[int]] = defaultdict(list)  # kind -> per-node device counts
        self._buckets: dict[Kind, dict[int, dict[str, None]]] = defaultdict(
            lambda: defaultdict(dict))
        self.free_devices = 0  # free devices of every kind on ready nodes
        self.kinds_by_gpu: dict[str, dict[str, Kind]] = {}  # node -> GPU id -> kind
        self.uniform: dict[str, Kind] = {}  # node -> its one device kind, if it has one
        for node in nodes:
            held = allocated.get(node.id, {})
            layout = _layout(node, layouts)
            self.kinds_by_gpu[node.id] = layout.kinds  # shared, read-only
            if len(layout.devices) == 1:
                self.uniform[node.id] = next(iter(layout.devices))
            for k, devs in layout.devices.items():
                self.total[k].append(len(devs))
            if node.state is not NodeState.READY:
                continue
            ucpu, umem = used_cpu_mem.get(node.id, (0.0, 0.0))
            free = _NodeFree(
                node,
                {k: [g for g in devs if g.id not in held] if held else list(devs)
                 for k, devs in layout.devices.items()},
                node.cpus - ucpu if node.cpus else float("inf"),
                node.memory_gb - umem if node.memory_gb else float("inf"),
            )
            self.nodes[node.id] = free
            for k, free_devs in free.devices.items():
                self.free_devices += len(free_devs)
                if free_devs:
                    self._buckets[k][len(free_devs)][node.id] = None

    @property
    def kinds(self) -> list[Kind]:
        return list(self.total)

    def free_gpus(self) -> int:
        return sum(len(d) for f in self.nodes.values() for d in f.devices.values())

    def wanted(self, res: Resources) -> list[Kind]:
        """The cluster's device kinds that satisfy ``res`` (memoised per request shape)."""
        kinds = self._wanted.get(res.key)
        if kinds is None:
            kinds = self._wanted[res.key] = wanted_kinds(res, self.kinds)
        return kinds

    def feasible_ever(self, res: Resources) -> bool:
        """Could the job fit on the cluster if it were empty?"""
        ok = self.feasible_memo.get(res.key)
        if ok is None:
            ok = self.feasible_memo[res.key] = any(
                self.kind_holds(res, k) for k in self.wanted(res)
            ) or (res.gpus == 0 and bool(self.nodes))
        return ok

    def kind_holds(self, res: Resources, kind: Kind) -> bool:
        """Could ``kind``'s devices hold the job if the cluster were empty?"""
        return sum(1 for n in self.total[kind] if n >= res.gpus) >= res.nodes

    def find(self, res: Resources, sites: tuple[str, ...],
             cap: Mapping[str, int] | None = None, cap_kind: Kind | None = None,
             horizon: Mapping[str, float] | None = None, end: float = 0.0,
             only: Collection[str] | None = None) -> tuple[Allocation, ...] | None:
        """Best-fit placement for ``res``, or None. Does not change the index.

        ``cap`` limits how many ``cap_kind`` devices may be used on some nodes (those a
        reservation needs later): backfill passes it for jobs that would outlive the reservation.
        ``horizon`` (node -> when its last running job is expected to end) turns on end-aligned
        packing: among the tightest candidates, prefer the node whose busy horizon the job, ending
        at ``end``, extends least. Long jobs then gather on the same nodes and the others free up
        whole, so reservations for wide jobs drain fewer GPUs. ``only`` restricts the nodes.
        """
        best: tuple[tuple[float, ...], Kind, list[str]] | None = None
        kinds: list[Kind] = self.wanted(res) if res.gpus else [None]  # type: ignore[list-item]
        if horizon is not None and res.gpus:
            kinds = self._fastest_first(res)
        for kind in kinds:
            if best is not None and horizon is not None and kind is not None \
                    and -speed_of(kind[0]) > best[0][0]:
                break  # a slower model never beats a placement on a faster one
            chosen = self._tightest(kind, res, sites, cap if kind == cap_kind else None,
                                    horizon, end, only)
            if chosen is None:
                continue
            # end-aligned packing also means finishing soonest: the fastest model first
            cost = chosen[0] if horizon is None or kind is None else (
                -speed_of(kind[0]), *chosen[0])
            if best is None or cost < best[0]:
                best = (cost, kind, chosen[1])  # type: ignore[assignment]
        if best is None:
            return None
        _, kind, node_ids = best
        return tuple(
            Allocation(nid, tuple(g.id for g in self.nodes[nid].devices[kind][: res.gpus])
                       if res.gpus else (), rank)
            for rank, nid in enumerate(node_ids)
        )

    def _fastest_first(self, res: Resources) -> list[Kind]:
        kinds = self._by_speed.get(res.key)
        if kinds is None:
            kinds = self._by_speed[res.key] = sorted(self.wanted(res),
                                                     key=lambda k: -speed_of(k[0]))
        return kinds

    ALIGN_CANDIDATES = 32  # nodes weighed by end-aligned packing (the tightest first)

    def _tightest(self, kind: Kind | None, res: Resources, sites: tuple[str, ...],
                  cap: Mapping[str, int] | None = None,
                  horizon: Mapping[str, float] | None = None, end: float = 0.0,
                  only: Collection[str] | None = None
                  ) -> tuple[tuple[float, int], list[str]] | None:
        picked: list[tuple[float, int, str]] = []  # (extension, leftover, node)
        if kind is None:  # a CPU-only job: any ready node with room
            nids = [nid for nid, f in self.nodes.items() if self.fits_host(f, res, sites)]
            return ((0.0, 0), nids[: res.nodes]) if len(nids) >= res.nodes else None
        buckets = self._buckets.get(kind, {})
        want = res.nodes if horizon is None else max(res.nodes, self.ALIGN_CANDIDATES)
        nodes, need, cpus, mem = self.nodes, res.gpus, res.cpus, res.memory_gb
        for count in sorted(c for c in buckets if c >= need):
            for nid in buckets[count]:
                if cap is not None and cap.get(nid, count) < need:
                    continue
                if only is not None and nid not in only:
                    continue
                f = nodes[nid]  # fits_host, inlined: this loop is the cycle's hottest
                if f.cpus >= cpus and f.mem >= mem and site_allows(f.node.site, sites):
                    ext = 0.0 if horizon is None else max(0.0, end - horizon.get(nid, 0.0))
                    picked.append((ext, count - need, nid))
                    if len(picked) >= want:
                        break
            if len(picked) >= want:
                break
        if len(picked) < res.nodes:
            return None
        if horizon is not None:
            picked.sort()
        chosen = picked[: res.nodes]
        return ((sum(c[0] for c in chosen), sum(c[1] for c in chosen)),
                [c[2] for c in chosen])

    @staticmethod
    def site_ok(f: _NodeFree, sites: tuple[str, ...]) -> bool:
        """May a job restricted to ``sites`` run on this node's site?"""
        return site_allows(f.node.site, sites)

    @staticmethod
    def fits_host(f: _NodeFree, res: Resources, sites: tuple[str, ...]) -> bool:
        site_ok = f.node.site in sites or (f.node.site != "onprem" and "cloud" in sites)
        return site_ok and f.cpus >= res.cpus and f.mem >= res.memory_gb

    def take(self, allocs: tuple[Allocation, ...], res: Resources) -> None:
        """Mark a placement's devices as used."""
        for a in allocs:
            f = self.nodes[a.node_id]
            f.cpus -= res.cpus
            f.mem -= res.memory_gb
            taken = set(a.gpu_ids)
            for kind, devs in f.devices.items():
                if not taken.intersection(g.id for g in devs):
                    continue
                before = len(devs)
                devs[:] = [g for g in devs if g.id not in taken]
                self.free_devices -= before - len(devs)
                bucket = self._buckets[kind]
                bucket[before].pop(a.node_id, None)
                if devs:
                    bucket[len(devs)][a.node_id] = None


Profile = dict[str, dict[Kind, list[tuple[float, int]]]]  # node -> kind -> [(end, devices)]


@dataclass
class Shadow:
    """A reservation being honoured during one cycle."""

    reservation: Reservation
    kind: Kind
    cap: dict[str, int] = field(default_factory=dict)  # node -> devices long jobs may still use
    slack_s: float = 0.0  # relaxed backfill: how late a backfilled job may end past the start
    scavengers: list[str] = field(default_factory=list)  # evicted when the reservation is due

    @cached_property
    def node_set(self) -> frozenset[str]:
        return frozenset(self.cap)  # the reserved nodes (cap's keys never change)

    def allows(self, now: float, estimate: float) -> bool:
        """Does a job of this estimate end before the reservation starts (plus the slack)?"""
        return now + estimate <= self.reservation.start_at + self.slack_s

    def charge(self, allocs: Iterable[Allocation]) -> None:
        """A job that outlives the reservation took devices on reserved nodes."""
        for a in allocs:
            if a.node_id in self.cap:
                self.cap[a.node_id] -= len(a.gpu_ids)
