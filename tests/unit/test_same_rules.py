"""The same rules everywhere: a cloud node (on-demand or spot) is preempted, fair-shared,
backfilled and explained as an on-prem node is. Each row runs one production cycle on a
snapshot whose only node has the given site; the plan must not depend on the site."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from broker.cycle.plan import Plan
from broker.cycle.scheduler import run_cycle
from broker.model import Allocation
from broker.model.state import JobState
from policies.registry import BUNDLES
from tests.builders import job, node, snapshot

SITES = ["onprem", "aws:us-east-1:ondemand", "aws:us-east-1:us-east-1a:spot"]
EVERYWHERE = ("onprem", "cloud", "spot")  # every job may run on any of them
H = 3600.0


def _running(job_id: str, n: str, gpus: list[int], **kw: Any) -> Any:
    alloc = Allocation(n, tuple(f"GPU-{n}-{i}" for i in gpus))
    j = job(job_id, len(gpus), state=JobState.RUNNING, allocations=(alloc,),
            sites=EVERYWHERE, checkpoint_dir="/ckpt", **kw)
    return replace(j, started_at=-H, attempt=1)


def _cycle(site: str, pending: list[Any], active: list[Any], count: int = 2,
           usage: dict[str, float] | None = None) -> Plan:
    snap = snapshot([node("n0", count, site=site)], pending, active)
    if usage:
        snap = replace(snap, usage=usage)
    return run_cycle(snap, BUNDLES["spillway"], snap.now)


@pytest.mark.parametrize("site", SITES)
def test_a_high_job_preempts_a_low_one_on_any_site(site: str) -> None:
    low = _running("low", "n0", [0, 1], priority="low", time_limit=10 * H)
    high = job("high", 2, priority="high", sites=EVERYWHERE)
    plan = _cycle(site, [high], [low])
    assert [p.job_id for p in plan.preemptions] == ["low"]


@pytest.mark.parametrize("site", SITES)
def test_the_team_that_used_less_goes_first_on_any_site(site: str) -> None:
    a, b = job("a", 1, sites=EVERYWHERE), job("b", 1, submitted=1.0, sites=EVERYWHERE)
    a = replace(a, spec=a.spec.model_copy(update={"team": "big"}))
    b = replace(b, spec=b.spec.model_copy(update={"team": "small"}))
    plan = _cycle(site, [a, b], [], count=1, usage={"big": 1e9, "small": 0.0})
    assert [s.job_id for s in plan.starts] == ["b"]


@pytest.mark.parametrize("site", SITES)
def test_a_short_job_backfills_ahead_of_a_blocked_one_on_any_site(site: str) -> None:
    busy = _running("busy", "n0", [0], priority="normal", time_limit=2 * H)
    big = job("big", 2, sites=EVERYWHERE, time_limit=4 * H)
    short = job("short", 1, submitted=1.0, sites=EVERYWHERE, time_limit=H)
    plan = _cycle(site, [big, short], [busy])
    assert [s.job_id for s in plan.starts] == ["short"]
    assert plan.reservation is not None and plan.reservation.job_id == "big"


@pytest.mark.parametrize("site", SITES)
def test_a_job_that_cannot_fit_is_explained_alike_on_any_site(site: str) -> None:
    busy = _running("busy", "n0", [0, 1], priority="high", time_limit=2 * H)
    waiting = job("waiting", 1, sites=EVERYWHERE)
    plan = _cycle(site, [waiting], [busy])
    codes = {k: v.code for k, v in plan.pending.items()}
    onprem = _cycle("onprem", [waiting], [busy])
    assert codes == {k: v.code for k, v in onprem.pending.items()}
    assert codes["waiting"]
