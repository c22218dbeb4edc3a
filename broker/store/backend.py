"""What a store backend implements: the persistence primitives under
:class:`broker.store.base.BaseStore`, which holds every rule once. The two backends are
:mod:`broker.store.redis` (with :mod:`broker.store.redis_base`, ``redis_records`` and
``redis_logs``) and :mod:`broker.store.memory`.

The central one is ``_commit(changes)``: for each Change, atomically check the job's version,
check that every claimed GPU is free on a live node, write the record, set the claims, drop
the releases, and keep the pending/active indexes in step with the job's state. It returns
one status per change: ``ok``, ``version`` (someone wrote first), ``busy`` (a GPU is taken)
or ``dead`` (a node's lease is gone).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from broker.model import Instance, Job, Node, Reason
from broker.store.leadership import Leadership

if TYPE_CHECKING:  # (for the types only: reading a job needs no transition)
    from broker.store import transitions as T


@dataclass(frozen=True)
class LogLine:
    cursor: str
    time: float
    stream: str  # "out" or "err"
    text: str


@dataclass(frozen=True)
class QueueOrder:
    """The pending queue as the last scheduling cycle ranked it (jobs it started left out).

    ``ids`` holds the first :data:`ORDER_CAP` of them; ``total`` counts them all; ``at`` is
    when the cycle's Plan was applied."""

    ids: tuple[str, ...]
    total: int
    at: float

    def position(self, job_id: str) -> int | None:
        """1-based place of ``job_id``; None if the cycle did not rank it (or past the cap)."""
        try:
            return self.ids.index(job_id) + 1
        except ValueError:
            return None


@dataclass(frozen=True)
class Block:
    """An offer's zone is not tried until ``until`` (after a capacity failure, a boot
    timeout or a spot notice; keys: :func:`broker.store.instances.block_key`)."""

    key: str
    until: float
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {"key": self.key, "until": self.until, "reason": self.reason}


ORDER_CAP = 10_000  # queue positions recorded per cycle (one value, rewritten each cycle)


class Backend(Leadership, ABC):
    """The primitives a backend supplies (abstract ones, and defaults it may do better)."""

    # -- primitives --------------------------------------------------------------------------

    @abstractmethod
    def _load(self, job_ids: Sequence[str]) -> list[Job | None]: ...

    @abstractmethod
    def _commit(self, changes: Sequence[T.Change]) -> list[str]: ...

    @abstractmethod
    def _index(self, which: str) -> list[str]:
        """Job ids in the ``pending``, ``active`` or ``all`` index, oldest first."""

    @abstractmethod
    def _archive(self, jobs: Sequence[Job]) -> None:
        """Move finished jobs from the hot keys to the archive (compressed), in one step."""

    @abstractmethod
    def _load_archived(self, job_id: str) -> Job | None: ...

    @abstractmethod
    def _put_node(self, node: Node, lease_expires: float) -> None: ...

    @abstractmethod
    def _load_nodes(self) -> list[Node]: ...

    @abstractmethod
    def _mark_down(self, node_id: str, expected_incarnation: str, now: float) -> bool:
        """Atomically mark a node DOWN and drop its GPU allocations, only if it is still the
        same incarnation and its lease ended by ``now``; False otherwise."""

    def _ack_node(self, node_id: str, incarnation: str) -> bool:
        """Take the agent incarnation ``incarnation`` of a node: it may hold jobs from now on
        and is in the node list. False if its record is of another incarnation. (A backend
        without agents of its own takes every node as it is written: True.)"""
        return True

    def _node_acked(self, node_id: str) -> tuple[str, str] | None:
        """(the incarnation in the node's record, the one taken), None for no record."""
        node = next((n for n in self._load_nodes() if n.id == node_id), None)
        return None if node is None else (node.incarnation, node.incarnation)

    @abstractmethod
    def _forget_node(self, node_id: str, incarnation: str) -> bool:
        """Delete a node that is DOWN in this incarnation (its record, its allocations, its
        place in the node list); False if it is not."""

    @abstractmethod
    def allocations(self, node_ids: Iterable[str] | None = None) -> dict[str, dict[str, str]]:
        """node id -> GPU id -> owner ("job:attempt") for the given (or all) nodes."""

    @abstractmethod
    def _write_reasons(self, set_: Mapping[str, Reason], delete: Sequence[str]) -> None: ...

    @abstractmethod
    def _read_reasons(self, job_ids: Sequence[str]) -> list[Reason | None]: ...

    @abstractmethod
    def _add_usage(self, team: str, gpu_s: float, now: float, half_life_s: float,
                   sample: tuple[str, str, int, float, float] | None = None) -> None:
        """Atomically decay a team's usage to ``now`` and add ``gpu_s``; with ``sample``, also
        append it to the runtime samples (one round trip for both)."""

    @abstractmethod
    def _read_usage(self) -> dict[str, tuple[float, float]]:
        """team -> (decayed GPU-seconds, as of time)."""

    @abstractmethod
    def _read_runtimes(self, cursor: str) -> tuple[list[tuple[str, str, int, float, float]],
                                                   str]:
        """Runtime samples after ``cursor`` (oldest first) and the new cursor."""

    @abstractmethod
    def _put_reservation(self, data: str | None) -> None: ...

    @abstractmethod
    def _get_reservation(self) -> str | None: ...

    @abstractmethod
    def _put_order(self, ids: Sequence[str], at: float) -> None:
        """Replace the recorded queue order (one value: the first ORDER_CAP ids, the count)."""

    @abstractmethod
    def _get_order(self) -> QueueOrder | None: ...

    @abstractmethod
    def _put_cycle_failure(self, at: float, error: str, keep: int) -> None:
        """Record a failed scheduling cycle (the newest ``keep`` are kept)."""

    @abstractmethod
    def _get_cycle_failures(self) -> list[tuple[float, str]]:
        """The failed cycles recorded, newest first: (time, error)."""

    @abstractmethod
    def append_logs(self, job_id: str, attempt: int, lines: Sequence[tuple[str, str]],
                    now: float, node_id: str = "") -> None:
        """Append (stream, text) lines to node ``node_id``'s log of an attempt ("": the node
        of its first part); refused (StaleAttempt) if the attempt does not run there."""

    @abstractmethod
    def read_logs(self, job_id: str, attempt: int, cursor: str = "0", limit: int = 1000,
                  block_s: float = 0.0) -> list[LogLine]: ...

    @abstractmethod
    def _load_instances(self, request_ids: Sequence[str] | None = None,
                        live_only: bool = False) -> list[tuple[Instance, int]]:
        """Instance records with their versions: these request ids (missing ones left out),
        or every one (``live_only``: those not ended), oldest request first."""

    @abstractmethod
    def _cas_instance(self, inst: Instance, expected_version: int) -> str:
        """Write ``inst`` if its record's version is ``expected_version`` (0: no record yet);
        fenced like a job write. ``ok``, ``version`` or ``fenced``."""

    @abstractmethod
    def _put_block(self, block: Block) -> None: ...

    @abstractmethod
    def _put_offers(self, doc: str) -> None:
        """Replace the published offers (one JSON document: the provisioner's, with a time)."""

    @abstractmethod
    def _get_offers(self) -> str | None: ...

    @abstractmethod
    def _put_boot(self, offer_id: str, raw: str) -> None:
        """Replace one offer's boot estimate (broker/store/boots.py, as JSON)."""

    @abstractmethod
    def _load_boots(self) -> dict[str, str]:
        """Every offer's boot estimate, as JSON, by offer id."""

    @abstractmethod
    def _load_blocks(self) -> list[Block]: ...
