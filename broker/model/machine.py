"""What the nodes' and instances' state tables share: a history entry and the checked move.

Each table maps a state to the states it may move to, with one comment per edge beside it
(jobs keep theirs in :mod:`broker.model.state`). A move off the table raises
:class:`~broker.errors.InvalidTransition`; a state with no way out is terminal.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Generic, TypeVar

from broker.errors import InvalidTransition

S = TypeVar("S", bound=Enum)


@dataclass(frozen=True)
class StateChange(Generic[S]):
    """One entry of a node's or an instance's history: the state it moved to, when, and why."""

    state: S
    time: float
    reason: str


def check_move(table: Mapping[S, frozenset[S]], what: str, ident: str, src: S, dst: S) -> None:
    """Raise InvalidTransition unless ``table`` has the edge ``src -> dst``."""
    if dst not in table[src]:
        raise InvalidTransition(ident, str(src.value), str(dst.value), what=what)


def terminal_states(table: Mapping[S, frozenset[S]]) -> frozenset[S]:
    """The states with no way out."""
    return frozenset(s for s, nxt in table.items() if not nxt)
