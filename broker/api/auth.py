"""Who may do what: every check the API makes on a token, each refusal naming what it lacks.

A job of a team the token may not see is reported missing (404, the same words as a job that
does not exist), so job ids never leak across teams. Everything else a token may not do is a
403 that says which role, or which team, would be needed; a priority class the token may not
submit into (broker/model/classes.py ``may_submit``) is a 403 naming the class, the team, who
may, and where an admin grants it.
"""

from __future__ import annotations

from broker.errors import JobNotFound
from broker.model import Job, JobSpec, SpecDefaults
from broker.model.classes import may_submit, refusal
from broker.security.tokens import Refused, TokenRecord

#: action -> the roles that may do it (a ``user`` only within its team)
ALLOWED: dict[str, tuple[str, ...]] = {
    "jobs.submit": ("user", "operator", "admin"),
    "jobs.read": ("user", "operator", "admin"),
    "jobs.cancel": ("user", "operator", "admin"),
    "nodes.read": ("operator", "admin"),
    "nodes.drain": ("operator", "admin"),
    "tokens": ("admin",),
    # budgets and reports (broker/api/budgets.py, reports.py): finance within its teams, a
    # user its own team's budget (what it has spent and has left)
    "budgets.read": ("user", "finance", "operator", "admin"),
    "budgets.write": ("finance", "admin"),
    "reports.read": ("finance", "operator", "admin"),
}

_WORDS = {
    "jobs.submit": "submitting jobs", "jobs.read": "reading jobs",
    "jobs.cancel": "cancelling jobs", "nodes.read": "listing nodes",
    "nodes.drain": "draining or resuming nodes", "tokens": "managing tokens",
    "budgets.read": "reading budgets", "budgets.write": "setting budgets",
    "reports.read": "reading reports",
}

TEAM_SCOPED = ("user", "finance")  # roles bound to their teams


def require(who: TokenRecord, action: str, team: str | None = None) -> None:
    """Refused unless ``who`` may do ``action`` (on ``team``'s things, where given)."""
    roles = ALLOWED[action]
    if who.role not in roles:
        raise Refused(f"{_WORDS[action]} needs a token with role "
                      f"{' or '.join(roles)}; yours ({who.user}) has role {who.role}")
    if team is not None and who.role in TEAM_SCOPED and team not in who.teams:
        raise Refused(f"{_WORDS[action]} of team {team!r} needs a token of team {team!r} "
                      f"(or role operator); yours ({who.user}) is for team "
                      f"{', '.join(who.teams)}")


def sees(who: TokenRecord, job: Job) -> bool:
    return who.role not in TEAM_SCOPED or job.team in who.teams


def visible(who: TokenRecord, job: Job) -> Job:
    """``job`` if ``who`` may see it; JobNotFound (as if it did not exist) otherwise."""
    if not sees(who, job):
        raise JobNotFound(job.id)
    return job


def list_team(who: TokenRecord, team: str | None) -> str | None:
    """The team filter a listing must use: a team-bound token lists its own team only."""
    require(who, "jobs.read", team)
    if who.role in TEAM_SCOPED and team is None:
        return who.team
    return team


def submit_team(who: TokenRecord, team: str | None) -> str | None:
    """The team a submission is charged to: a user's own team when it names none."""
    require(who, "jobs.submit", team)
    if who.role in TEAM_SCOPED:
        return team or who.team
    return team


def class_allowed(who: TokenRecord, spec: JobSpec, config: SpecDefaults, at: str = "") -> JobSpec:
    """``spec`` (checked: its class and team resolved) if ``who`` may submit into its class;
    Refused (403) naming the class, the team, who may and who grants it otherwise. (``at``:
    the spec's place in a batch, for the message.)"""
    cls = config.priority(spec.priority or config.default_class)
    if cls is not None and not may_submit(cls, who.role, spec.team):
        where = f"spec {at.rstrip('.')}: " if at else ""
        raise Refused(where + refusal(cls, who.role, spec.team))
    return spec
