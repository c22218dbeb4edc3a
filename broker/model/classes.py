"""Priority classes and teams: what the configuration names and the policies read.

A class is also a permission: who may submit into it (:func:`may_submit`), and a team may be
capped in the GPUs it holds in each class at once (:meth:`Team.class_cap`).
"""

from __future__ import annotations

from dataclasses import dataclass

#: The roles an API token may have (broker/security/tokens.py; docs/api.md has the table).
ROLES = ("user", "finance", "operator", "admin")
#: Everyone (every token role): a class open to all.
OPEN: tuple[str, ...] = ()


@dataclass(frozen=True)
class PriorityClass:
    """A priority class: its rank orders the queue; its SLA is the longest wait it accepts.

    ``allowed_roles`` and ``allowed_teams`` say who may submit into it through the API: a
    token whose role is one of ``allowed_roles`` or whose team is one of ``allowed_teams``.
    Both empty: open to everyone. (Direct-Redis clients are administrators: not checked.)"""

    name: str
    rank: int
    sla_s: float
    may_preempt: bool = False
    preemptible: bool = True
    may_burst: bool = True
    spot_allowed: bool = True
    flexible: bool = False  # its jobs may wait for cleaner power within the SLA (defer)
    allowed_roles: tuple[str, ...] = OPEN  # roles that may submit it (empty and no teams: all)
    allowed_teams: tuple[str, ...] = ()  # teams that may submit it, whatever their role

    @property
    def is_open(self) -> bool:
        return not self.allowed_roles and not self.allowed_teams


def may_submit(cls: PriorityClass, role: str, team: str | None) -> bool:
    """Whether a token of ``role`` submitting for ``team`` may use class ``cls``."""
    return (cls.is_open or role in cls.allowed_roles
            or (team is not None and team in cls.allowed_teams))


def refusal(cls: PriorityClass, role: str, team: str | None) -> str:
    """Why ``role`` of ``team`` may not submit ``cls``, who may, and who grants it."""
    roles = ", ".join(cls.allowed_roles) or "none"
    teams = ", ".join(cls.allowed_teams) or "none"
    whose = f"team {team!r}" if team else "a job of no team"
    return (f"priority {cls.name!r} is not open to {whose} (role {role}); allowed: roles "
            f"{roles}; teams: {teams}. An admin grants it in the configuration: "
            f"classes.{cls.name}.allowed_teams (or allowed_roles)")


@dataclass(frozen=True)
class Team:
    """A team: its fair-share weight and the on-prem GPUs it is guaranteed (others may borrow
    them while idle; the owner reclaims them, by preemption where the borrowers allow it).

    ``class_caps``: (class, GPUs) pairs, the most GPUs the team may hold at once in each class
    (starting and running jobs; a class not listed: no cap)."""

    name: str
    weight: float = 1.0
    quota_gpus: int = 0
    class_caps: tuple[tuple[str, int], ...] = ()

    def class_cap(self, priority: str) -> int | None:
        """The most GPUs of class ``priority`` the team may hold at once (None: no cap)."""
        return next((gpus for name, gpus in self.class_caps if name == priority), None)
