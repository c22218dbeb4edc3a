"""Cloud instances in the store: every launch and termination, and zones cooling down (a part
of the store: its functions take the :class:`~broker.store.core.StoreCore` they work on).

One record per machine, keyed by its request id (the id written into the machine's tags, so a
restarted provisioner finds the machine again). A Plan's :class:`~broker.cycle.plan.Launch` of
``count`` machines becomes ``count`` records (:func:`request_ids`). Records are never deleted:
ended ones stay as the ledger of what was rented, when, at what price and why. Every write is
compare-and-set on the record's version (and fenced like job writes when a leader makes it).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from broker.errors import Conflict, Fenced, InvalidTransition
from broker.model import Instance, InstanceState, Market, Offer, Site
from broker.store.backend import Block as Block  # (kept here for its importers)
from broker.store.status import FENCED, OK, RETRIES, VERSION

if TYPE_CHECKING:
    from broker.store.core import StoreCore


def request_ids(request_id: str, count: int) -> list[str]:
    """The request id of each machine of a launch: the launch's own for one machine,
    ``<id>-1`` ... ``<id>-<count>`` for several."""
    return [request_id] if count == 1 else [f"{request_id}-{i}" for i in range(1, count + 1)]


def block_key(provider: str, region: str, zone: str, instance_type: str) -> str:
    """What a capacity failure cools down: one instance type in one zone of one provider."""
    return f"{provider}:{region}:{zone}:{instance_type}"


def block_key_of(offer_id: str) -> str:
    """:func:`block_key` of an offer id (``site/instance_type``)."""
    site_id, _, instance_type = offer_id.partition("/")
    site = Site.parse(site_id)
    return block_key(site.provider, site.region, site.zone, instance_type)


def record(store: StoreCore, instances: Sequence[Instance]) -> list[Instance]:
    """Store new REQUESTED records; a request id already stored is left as it is (a Plan
    applied twice, a repeated operator launch). Returns the records this call created."""
    created = []
    for inst in instances:
        status = store._cas_instance(inst, 0)
        if status == FENCED:
            raise Fenced(store.fence_token() or "")
        if status == OK:
            created.append(inst)
    return created


def update(store: StoreCore, request_id: str,
           fn: Callable[[Instance], Instance | None]) -> Instance | None:
    """Read, change with ``fn`` (None: no change), compare-and-set; retry on a lost race.
    Returns the record as stored after the call; None if there is no such record."""
    for _ in range(RETRIES):
        found = store._load_instances([request_id])
        if not found:
            return None
        inst, version = found[0]
        new = fn(inst)
        if new is None or new == inst:
            return inst
        status = store._cas_instance(new, version)
        if status == OK:
            return new
        if status == FENCED:
            raise Fenced(store.fence_token() or "")
        if status != VERSION:
            raise Conflict(f"instance {request_id}: write refused ({status})")
    raise Conflict(f"instance {request_id}: too many concurrent writers")


def move(store: StoreCore, request_id: str, to: InstanceState, now: float, reason: str,
         **changes: Any) -> Instance | None:
    """Move a record along the instance state table. A record already in ``to`` gets only
    ``changes``; a move the table does not allow from its current state (another writer moved
    it first) leaves it unchanged. Returns the record as stored; None if there is none."""

    def step(inst: Instance) -> Instance | None:
        if inst.state is to:
            return Instance.from_dict({**inst.to_dict(), **_plain(changes)}) if changes \
                else None
        try:
            return inst.moved(to, now, reason, **changes)
        except InvalidTransition:
            return None

    return update(store, request_id, step)


def _plain(changes: Mapping[str, Any]) -> dict[str, Any]:
    return {k: list(v) if isinstance(v, tuple) else v for k, v in changes.items()}


_OFFER_FIELDS = ("provider", "region", "zone", "instance_type", "gpu_model", "gpu_count",
                 "gpu_memory_gb", "market", "price_per_hour", "carbon_zone")


def offers_doc(offers: Sequence[Offer], now: float) -> str:
    """Offers as one JSON document (``extra`` kept where JSON can hold it)."""
    rows = []
    for o in offers:
        row = {k: getattr(o, k) for k in _OFFER_FIELDS}
        row["market"] = o.market.value
        row["extra"] = dict(o.extra)
        rows.append(row)
    return json.dumps({"at": now, "offers": rows}, default=str, separators=(",", ":"))


def offers_from(doc: str) -> list[Offer]:
    out = []
    for row in json.loads(doc).get("offers", []):
        row = dict(row)
        row["market"] = Market(row["market"])
        out.append(Offer(**row))
    return out
