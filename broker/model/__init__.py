"""The model: Spillway's vocabulary, below the configuration and the policies.

What a user asks for (:mod:`.spec`), what the system tracks about jobs (:mod:`.job`) and
nodes (:mod:`.node`), priority classes and teams (:mod:`.classes`), and sites, cloud offers
and rented instances (:mod:`.cloud`). Each state machine is an explicit table. Nothing here
imports ``broker.config.core`` or ``policies``: the configuration imports the model, not the other
way round. Every name is re-exported here, so ``from broker.model import X`` keeps working; each is
loaded when first asked for, so importing one module of the model (the job states, the GPU
models) does not load the rest (pydantic's JobSpec among them).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from broker.errors import FieldError, InvalidTransition, SpecError
    from broker.model.classes import PriorityClass, Team
    from broker.model.cloud import (
        INSTANCE_TERMINAL,
        INSTANCE_TRANSITIONS,
        ONPREM,
        Instance,
        InstanceState,
        Market,
        Offer,
        Site,
    )
    from broker.model.job import (
        BY_AGE,
        Allocation,
        Attempt,
        BurstOutlook,
        HistoryEntry,
        Job,
        Reason,
    )
    from broker.model.machine import StateChange
    from broker.model.node import NODE_TERMINAL, NODE_TRANSITIONS, Gpu, Node, NodeState
    from broker.model.spec import (
        SITES,
        JobSpec,
        Resources,
        SpecDefaults,
        parse_duration,
        parse_time,
    )
    from broker.model.state import JobState

_WHERE = {  # name -> the module that defines it
    "Allocation": "broker.model.job",
    "Attempt": "broker.model.job",
    "BY_AGE": "broker.model.job",
    "BurstOutlook": "broker.model.job",
    "FieldError": "broker.errors",
    "Gpu": "broker.model.node",
    "HistoryEntry": "broker.model.job",
    "INSTANCE_TERMINAL": "broker.model.cloud",
    "INSTANCE_TRANSITIONS": "broker.model.cloud",
    "Instance": "broker.model.cloud",
    "InstanceState": "broker.model.cloud",
    "InvalidTransition": "broker.errors",
    "Job": "broker.model.job",
    "JobSpec": "broker.model.spec",
    "JobState": "broker.model.state",
    "Market": "broker.model.cloud",
    "NODE_TERMINAL": "broker.model.node",
    "NODE_TRANSITIONS": "broker.model.node",
    "Node": "broker.model.node",
    "NodeState": "broker.model.node",
    "ONPREM": "broker.model.cloud",
    "Offer": "broker.model.cloud",
    "PriorityClass": "broker.model.classes",
    "Reason": "broker.model.job",
    "Resources": "broker.model.spec",
    "SITES": "broker.model.spec",
    "Site": "broker.model.cloud",
    "SpecDefaults": "broker.model.spec",
    "SpecError": "broker.errors",
    "StateChange": "broker.model.machine",
    "Team": "broker.model.classes",
    "parse_duration": "broker.model.spec",
    "parse_time": "broker.model.spec",
}

__all__ = [
    "BY_AGE",
    "INSTANCE_TERMINAL",
    "INSTANCE_TRANSITIONS",
    "NODE_TERMINAL",
    "NODE_TRANSITIONS",
    "ONPREM",
    "SITES",
    "Allocation",
    "Attempt",
    "BurstOutlook",
    "FieldError",
    "Gpu",
    "HistoryEntry",
    "Instance",
    "InstanceState",
    "InvalidTransition",
    "Job",
    "JobSpec",
    "JobState",
    "Market",
    "Node",
    "NodeState",
    "Offer",
    "PriorityClass",
    "Reason",
    "Resources",
    "Site",
    "SpecDefaults",
    "SpecError",
    "StateChange",
    "Team",
    "parse_duration",
    "parse_time",
]


def __getattr__(name: str) -> Any:
    """A re-exported name, loaded from its module when first asked for (PEP 562)."""
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
