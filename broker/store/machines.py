"""The machines in the store: nodes (heartbeats, leases, drains, requeueing the jobs of a dead
one) and the cloud instances Spillway rented, with their offers, boot estimates and zones
cooling down. :class:`Machines` is the part of :class:`~broker.store.base.BaseStore` that
serves them; the rules are in :mod:`broker.store.nodes`, :mod:`broker.store.instances` and
:mod:`broker.store.boots` (imported where a method uses them: a command that reads jobs loads
none of them; tests/unit/test_cli_imports.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from broker.model import Instance, InstanceState, Job, Node, NodeState, Offer
from broker.store.backend import Block
from broker.store.core import StoreCore

if TYPE_CHECKING:
    from broker.store import boots as _boots


class Machines(StoreCore):
    """Nodes and cloud instances (abstract: part of :class:`~broker.store.base.BaseStore`)."""

    # -- nodes (broker/store/nodes.py) ---------------------------------------------------------

    def adopt_node(self, node_id: str, incarnation: str, now: float) -> list[Job]:
        """Take a node's new agent incarnation, requeueing what earlier ones held
        (broker/store/nodes.py :func:`adopt`)."""
        from broker.store import nodes as _nodes

        return _nodes.adopt(self, node_id, incarnation, now)

    def take_node_reports(self, limit: int = 1000) -> list[tuple[str, list[tuple[str, Any]]]]:
        """Agents' waiting reports by node (a backend whose agents write no stream: none)."""
        return []

    def done_node_reports(self, node_id: str, entry_ids: Sequence[str]) -> None:
        """Forget reports once applied."""

    def heartbeat(self, node: Node, ttl: float, now: float) -> list[Job]:
        """Register or renew a node's lease. A new incarnation (the agent restarted) loses the
        jobs the old one held: their processes died with it. Returns the jobs requeued."""
        from broker.store import nodes as _nodes

        return _nodes.heartbeat(self, node, ttl, now)

    def set_node_state(self, node_id: str, state: NodeState, by: str = "operator") -> Node:
        """Drain (DRAINING) or resume (READY) a node, as ``by`` (recorded on a drain, cleared
        on a resume). DOWN is only reached by lease expiry."""
        from broker.store import nodes as _nodes

        return _nodes.set_node_state(self, node_id, state, by)

    def nodes(self) -> list[Node]:
        from broker.store import nodes as _nodes

        return _nodes.nodes(self)

    def forget_node(self, node_id: str) -> bool:
        """Drop a DOWN node from the store (a cloud machine given back: it never returns, and
        would stay listed DOWN forever). False if it is not DOWN; an agent that registers again
        later is a new node."""
        node = next((n for n in self._load_nodes() if n.id == node_id), None)
        return node is not None and self._forget_node(node_id, node.incarnation)

    def forget_dead_node(self, node_id: str, now: float, force: bool = False) -> list[Job]:
        """An operator removes a dead node (``spillway nodes --forget``); NodeNotFound,
        NodeBusy while it is alive or holds jobs (``force``: they are requeued); the jobs
        requeued (broker/store/nodes.py :func:`forget`)."""
        from broker.store import nodes as _nodes

        return _nodes.forget(self, node_id, now, force)

    def expire(self, now: float) -> list[Job]:
        """Mark nodes whose lease lapsed DOWN and requeue their jobs."""
        from broker.store import nodes as _nodes

        return _nodes.expire(self, now)

    # -- cloud instances (broker/store/instances.py) -------------------------------------------

    def record_instances(self, instances: Sequence[Instance]) -> list[Instance]:
        """Store new instance records (REQUESTED); a request id already stored is left alone.
        Returns the records created."""
        from broker.store import instances as _instances

        return _instances.record(self, instances)

    def instance(self, request_id: str) -> Instance | None:
        found = self._load_instances([request_id])
        return found[0][0] if found else None

    def instances(self, live_only: bool = False) -> list[Instance]:
        """Every instance record (the ledger), oldest request first; ``live_only``: those
        not TERMINATED or FAILED."""
        return [i for i, _ in self._load_instances(None, live_only)]

    def update_instance(self, request_id: str,
                        fn: Callable[[Instance], Instance | None]) -> Instance | None:
        """Compare-and-set ``fn``'s change of a record (None from ``fn``: no change)."""
        from broker.store import instances as _instances

        return _instances.update(self, request_id, fn)

    def move_instance(self, request_id: str, to: InstanceState, now: float, reason: str,
                      **changes: object) -> Instance | None:
        """Move a record along the instance state table (a move it does not allow from the
        record's current state leaves it unchanged); the record as stored, or None. The move
        that makes a record READY (its agent registered) teaches its offer's boot estimate
        (broker/store/boots.py)."""
        from broker.store import instances as _instances

        out = _instances.move(self, request_id, to, now, reason, **changes)
        if to is InstanceState.READY and out is not None and out.ready_at == now \
                and out.state is InstanceState.READY:
            self.observe_boot(out.offer_id, now - out.requested_at, now)
        return out

    def observe_boot(self, offer_id: str, seconds: float, now: float) -> _boots.BootEstimate:
        """One more machine of ``offer_id`` booted in ``seconds``: its estimate updated."""
        from broker.store import boots as _boots

        raw = self._load_boots().get(offer_id)
        est = _boots.BootEstimate.from_json(raw).observed(seconds, now) if raw \
            else _boots.first(seconds, now)
        self._put_boot(offer_id, est.to_json())
        return est

    def boot_estimates(self) -> dict[str, _boots.BootEstimate]:
        """Each offer's boot estimate, of those that booted a machine, by offer id."""
        from broker.store import boots as _boots

        return {k: _boots.BootEstimate.from_json(v) for k, v in self._load_boots().items()}

    def boot_seed(self, provider: str) -> float:
        """The boot of a provider's machines before any was seen: its ``boot_s`` setting,
        else its kind's default (broker/store/boots.py)."""
        from broker.store import boots as _boots

        cfg = self.config.providers.get(provider)
        if cfg is None:
            return _boots.default_for(provider)
        return cfg.boot_s if cfg.boot_s is not None else _boots.default_for(cfg.kind)

    def block(self, key: str, until: float, reason: str) -> None:
        """Cool an offer's zone down until ``until`` (keys: instances.block_key)."""
        self._put_block(Block(key, until, reason))

    def blocks(self, now: float) -> dict[str, Block]:
        """The zones cooling down at ``now``, by key."""
        return {b.key: b for b in self._load_blocks() if b.until > now}

    def publish_offers(self, offers: Sequence[Offer], now: float) -> None:
        """Replace the offers the provisioner could rent now (its providers' offers; the
        scheduler reads them here: cloud credentials stay with the provisioner)."""
        from broker.store import instances as _instances

        self._put_offers(_instances.offers_doc(offers, now))

    def offers(self, now: float, include_blocked: bool = False) -> list[Offer]:
        """The published offers, less those whose zone cools down at ``now``, each with its
        boot estimate in ``extra["boot_s"]`` (broker/store/boots.py)."""
        from broker.store import boots as _boots
        from broker.store import instances as _instances

        raw = self._get_offers()
        offers = _instances.offers_from(raw) if raw else []
        if not offers:
            return offers
        offers = _boots.dressed(offers, self.boot_estimates(), self.boot_seed)
        if include_blocked:
            return offers
        blocked = self.blocks(now)
        return [o for o in offers if _instances.block_key(
            o.provider, o.region, o.zone, o.instance_type) not in blocked]
