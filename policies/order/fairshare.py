"""Fair share: how much each team has used lately, against what it is entitled to.

Usage is GPU-seconds, decayed with a half-life (Slurm's PriorityDecayHalfLife): the store keeps
the decayed sum of finished attempts; the running jobs' GPU-seconds so far are added here. The
factor is Slurm's classic fair-share formula, ``F = 2 ** (-U / S)``, with ``U`` the team's share
of all usage and ``S`` its share of the weights (SchedMD, "Multifactor Priority Plugin",
Fairshare Factor). F is 1 for a team that used nothing and 0.5 for one that used exactly its
share.
"""

from __future__ import annotations

from collections import defaultdict

from broker.cycle.plan import Snapshot


def team_usage(snapshot: Snapshot) -> dict[str, float]:
    """Decayed GPU-seconds per team, running jobs included."""
    usage: dict[str, float] = defaultdict(float, snapshot.usage)
    now = snapshot.now
    for job in snapshot.active:
        if job.started_at is not None:
            usage[job.team] += job.res.total_gpus * max(0.0, now - job.started_at)
    return usage


def fairshare_factors(snapshot: Snapshot) -> dict[str, float]:
    """Team -> F in (0, 1]; teams seen in the config, the queue or the running jobs (a cycle
    computes it once: ``Cycle.fairshare``)."""
    usage = team_usage(snapshot)
    teams = {t.name for t in snapshot.teams} | set(usage)
    teams.update(j.team for j in snapshot.pending)
    weights = {t: snapshot.team_by_name[t].weight if t in snapshot.team_by_name else 1.0
               for t in teams}
    total_w = sum(weights.values()) or 1.0
    total_u = sum(usage.values())
    out = {}
    for t in teams:
        u = usage.get(t, 0.0) / total_u if total_u > 0 else 0.0
        s = weights[t] / total_w
        out[t] = 2.0 ** (-u / s)
    return out


def gpus_in_use(snapshot: Snapshot) -> dict[str, int]:
    """Team -> GPUs its active jobs hold."""
    used: dict[str, int] = defaultdict(int)
    for job in snapshot.active:
        used[job.team] += job.res.total_gpus
    return used
