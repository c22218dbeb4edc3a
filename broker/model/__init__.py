"""The model: Spillway's vocabulary, below the configuration and the policies.

What a user asks for (:mod:`.spec`), what the system tracks about jobs (:mod:`.job`) and
nodes (:mod:`.node`), priority classes and teams (:mod:`.classes`), and sites, cloud offers
and rented instances (:mod:`.cloud`). Each state machine is an explicit table. Nothing here
imports ``broker.config`` or ``policies``: the configuration imports the model, not the other
way round. Every name is re-exported here, so ``from broker.model import X`` keeps working.
"""

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
from broker.model.spec import SITES, JobSpec, Resources, SpecDefaults, parse_duration, parse_time
from broker.state import JobState

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
