"""Nodes: hosts running a worker agent, their GPUs, and the node state table.

Where the store changes a node's state today (``broker/store/nodes.py``, ``memory.py``,
``redis.py``), and the edge of :data:`NODE_TRANSITIONS` each change is:

- ``set_node_state`` (``spillway drain`` / ``resume``): READY <-> DRAINING, and a DOWN node
  drained or resumed by an operator;
- ``heartbeat``: an agent that drains itself reports DRAINING; a node that was DOWN comes back
  in the state its agent reports (READY, or DRAINING when it was draining);
- ``expire`` / ``_mark_down`` (the reconciler), and ``heartbeat`` from a new incarnation: READY
  or DRAINING -> DOWN.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from enum import Enum
from functools import cached_property
from typing import Any

from broker.model.machine import StateChange, check_move, terminal_states


class NodeState(str, Enum):
    READY = "READY"  # accepts new jobs
    DRAINING = "DRAINING"  # runs what it has, takes nothing new
    DOWN = "DOWN"  # lease expired

    def __str__(self) -> str:
        return self.value


_N = NodeState

NODE_TRANSITIONS: dict[NodeState, frozenset[NodeState]] = {
    _N.READY: frozenset(
        {
            _N.DRAINING,  # an operator drains it, or its agent drains itself before stopping
            _N.DOWN,  # its lease expired, or its agent restarted (a new incarnation)
        }
    ),
    _N.DRAINING: frozenset(
        {
            _N.READY,  # an operator resumes it
            _N.DOWN,  # its lease expired, or its agent restarted (a new incarnation)
        }
    ),
    _N.DOWN: frozenset(
        {
            _N.READY,  # its agent heartbeats again (or an operator resumes it)
            _N.DRAINING,  # a draining agent heartbeats again, or an operator drains it
        }
    ),
}
"""Every legal move of a node. No state is terminal: a node that went DOWN may come back.
Staying in the same state (a heartbeat, a second drain) is not a move."""

NODE_TERMINAL: frozenset[NodeState] = terminal_states(NODE_TRANSITIONS)


@dataclass(frozen=True)
class Gpu:
    """One allocatable device: a whole GPU, or one MIG instance (then ``mig_profile`` is set)."""

    id: str  # UUID (GPU-... or MIG-...)
    index: int
    model: str  # canonical model of the physical GPU
    memory_gb: float
    mig_profile: str | None = None
    parent: str | None = None  # the physical GPU's UUID for a MIG instance
    mig_enabled: bool = False  # a whole GPU that is split into MIG instances
    # the minor of its /dev/nvidiaN (a MIG instance: its parent's); None: unknown, taken to be
    # ``index`` (a static inventory's default)
    minor: int | None = None
    caps: tuple[int, ...] = ()  # a MIG instance: the minors of its /dev/nvidia-caps devices

    @property
    def device_minor(self) -> int:
        """The minor of the ``/dev/nvidiaN`` this device's jobs open."""
        return self.index if self.minor is None else self.minor

    def to_dict(self) -> dict[str, Any]:
        """Its fields; ``minor`` and ``caps`` only where set, so records stay as they were."""
        out = dict(vars(self))
        if self.minor is None:
            del out["minor"]
        if not self.caps:
            del out["caps"]
        else:
            out["caps"] = list(self.caps)
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Gpu:
        """A record's GPU; one written before ``minor`` and ``caps`` existed loads too."""
        return cls(**{**d, "caps": tuple(d.get("caps", ()))})


@dataclass(frozen=True)
class Node:
    id: str
    gpus: tuple[Gpu, ...]
    site: str = "onprem"
    hostname: str = ""
    cpus: float = 0.0
    memory_gb: float = 0.0
    labels: Mapping[str, str] = field(default_factory=dict)
    state: NodeState = NodeState.READY
    lease_expires: float = 0.0
    incarnation: str = ""  # changes when the agent restarts
    instance_id: str = ""  # the cloud machine it runs on (its provider id); "" on-prem
    drained_by: str = ""  # who drained it ("" when no one did, or an agent drains itself):
    # an operator's drain outlives the agent's heartbeats, restarts and a DOWN spell
    isolation: str = ""  # what keeps its jobs apart, as its agent says (workers/users.py)
    history: tuple[StateChange[NodeState], ...] = ()  # the moves made through moved()

    def moved(self, to: NodeState, now: float, reason: str, **changes: Any) -> Node:
        """Move to ``to`` along an edge of NODE_TRANSITIONS, recording history; raise
        InvalidTransition for any other move."""
        check_move(NODE_TRANSITIONS, "node", self.id, self.state, to)
        entry = StateChange(to, now, reason)
        return replace(self, state=to, history=(*self.history, entry), **changes)

    def to_dict(self) -> dict[str, Any]:
        out = {
            "id": self.id,
            "gpus": [g.to_dict() for g in self.gpus],
            "site": self.site,
            "hostname": self.hostname,
            "cpus": self.cpus,
            "memory_gb": self.memory_gb,
            "labels": dict(self.labels),
            "state": self.state.value,
            "lease_expires": self.lease_expires,
            "incarnation": self.incarnation,
        }
        if self.instance_id:  # (absent on-prem)
            out["instance_id"] = self.instance_id
        if self.drained_by:  # (absent when empty, as history)
            out["drained_by"] = self.drained_by
        if self.isolation:
            out["isolation"] = self.isolation
        if self.history:  # absent when empty: records written before it existed stay the same
            out["history"] = [[h.state.value, h.time, h.reason] for h in self.history]
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Node:
        return cls(
            id=d["id"],
            gpus=tuple(Gpu.from_dict(g) for g in d["gpus"]),
            site=d.get("site", "onprem"),
            hostname=d.get("hostname", ""),
            cpus=d.get("cpus", 0.0),
            memory_gb=d.get("memory_gb", 0.0),
            labels=d.get("labels", {}),
            state=NodeState(d.get("state", "READY")),
            lease_expires=d.get("lease_expires", 0.0),
            incarnation=d.get("incarnation", ""),
            instance_id=d.get("instance_id", ""),
            drained_by=d.get("drained_by", ""),
            isolation=d.get("isolation", ""),
            history=tuple(StateChange(NodeState(s), t, r) for s, t, r in d.get("history", ())),
        )

    @cached_property
    def allocatable(self) -> tuple[Gpu, ...]:
        """Devices a job can hold: whole GPUs not split by MIG, and MIG instances."""
        return tuple(g for g in self.gpus if not g.mig_enabled)
