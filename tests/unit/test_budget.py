"""Budgets: the cap arithmetic of the budget step (policies/burst/budget.py), the budget book on
both
backends (broker/store/budgets*.py) and the ledger's split and idempotent charges
(broker/money/ledger.py)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import redis

from broker.cycle.plan import Launch, Plan
from broker.cycle.scheduler import run_cycle
from broker.model import Instance, InstanceState, Job, Offer, StateChange
from broker.money.ledger import Use, charge_instance, reserve_plan, split
from broker.store.budgets import Budget, BudgetBook, BudgetError, Part, parse_alerts, window_ids
from broker.store.budgets_memory import MemoryBudgets
from broker.store.budgets_redis import RedisBudgets
from tests.builders import node
from tests.unit.test_burst import OD, SLA, SPOT, late
from tests.unit.test_preemption import NOW as BURST_NOW
from tests.unit.test_preemption import running, snap

H = 3600.0
# SPOT: $0.918/h, boots in 60 s; late(): 1 GPU, time limit 2 h; the idle tail is 300 s
COST = 0.918 * (60 + 2 * H + 300) / H  # 1.9278


def budgets(caps: dict[str, float], spend: dict[str, float] | None = None,
            soft: frozenset[str] = frozenset()) -> dict[str, Any]:
    return {"budgets": caps, "spend": spend or {}, "soft_budgets": soft}


# (jobs, snapshot budget fields, cycle kwargs, launches [(jobs, budget)], reason codes)
ROWS: dict[str, tuple[list[Any], dict[str, Any], dict[str, Any], list[Any], dict[str, str]]] = {
    "no budget: the launch as planned": (
        [late()], {}, {}, [(("p",), ())], {"p": "Bursting"}),
    "within the cap: reserved at its expected cost": (
        [late()], budgets({"t": 10.0}), {}, [(("p",), (("t", COST),))], {"p": "Bursting"}),
    "exactly to the cap": (
        [late()], budgets({"t": 10.0}, {"t": 10.0 - COST}), {}, [(("p",), (("t", COST),))], {}),
    "a cent over the cap: refused": (
        [late()], budgets({"t": 10.0}, {"t": 10.01 - COST}), {}, [],
        {"p": "BudgetExhausted"}),
    "another team's cap does not apply": (
        [late()], budgets({"other": 0.0}), {}, [(("p",), (("t", COST),))], {}),
    "a zero cap refuses every burst": (
        [late()], budgets({"t": 0.0}), {}, [], {"p": "BudgetExhausted"}),
    "the second job of a cycle sees the first's cost": (
        [late("p1"), late("p2")], budgets({"t": 3.0}), {"offers": (SPOT,)},
        [(("p1",), (("t", COST),))], {"p2": "BudgetExhausted"}),
    "soft cap passed, SLA not broken long: waits": (
        [late()], budgets({"t": 1.0}, {"t": 5.0}, frozenset({"t"})), {}, [],
        {"p": "BudgetSoftCap"}),
    "soft cap passed, SLA broken long ago: bursts": (
        [late(left=-2000)], budgets({"t": 1.0}, {"t": 5.0}, frozenset({"t"})), {},
        [(("p",), (("t", 0.918 * (60 + 2 * H + 300) / H),))], {"p": "Bursting"}),
}


def plan_of(queue: list[Job], fields: dict[str, Any], offers: tuple[Offer, ...] = (SPOT, OD)
            ) -> Plan:
    s = snap([node("a", 4)], queue, [running("r", 4, time_limit=20 * H)], offers=offers,
             **fields)
    return run_cycle(s, SLA, BURST_NOW)


@pytest.mark.parametrize("name", list(ROWS))
def test_cap_arithmetic(name: str) -> None:
    jobs, fields, kw, want, reasons = ROWS[name]
    plan = plan_of(jobs, fields, **kw)
    got = [(x.for_jobs, tuple((t, round(v, 6)) for t, v in x.budget)) for x in plan.launches]
    assert got == [(j, tuple((t, round(v, 6)) for t, v in b)) for j, b in want]
    for job_id, code in reasons.items():
        assert plan.pending[job_id].code == code
    if "refused" in name:
        assert "over the cap by $0.01" in plan.pending["p"].message


def test_budget_validation_names_the_field() -> None:
    for kw, field in (({"amount": -1}, "amount"), ({"window": "year"}, "window"),
                      ({"alerts": (0,)}, "alerts"), ({"team": "a b"}, "team")):
        args: dict[str, Any] = {"team": "t", "amount": 5.0, **kw}
        with pytest.raises(BudgetError, match=f"^{field}: "):
            Budget(**args)
    with pytest.raises(BudgetError, match=r"^alerts: 'x'"):
        parse_alerts("50,x")
    assert Budget("t", 5, alerts=parse_alerts("100,50%")).alerts == (50.0, 100.0)
    assert window_ids(1764892800.0) == {"month": "2025-12", "week": "2025-W49",  # a Friday
                                         "total": "total"}


@pytest.fixture(params=["memory", "redis"])
def book(request: pytest.FixtureRequest) -> Iterator[BudgetBook]:
    if request.param == "memory":
        yield MemoryBudgets()
        return
    client: redis.Redis = request.getfixturevalue("redis_client")
    yield RedisBudgets(client, request.getfixturevalue("redis_prefix"))


def part(team: str, usd: float) -> Part:
    return Part(team, usd, 0.0, 0.0, "aws:r:ondemand", "2026-12-05")


NOW = 1764892800.0 + 4 * 86400  # Tuesday 2025-12-09 00:00 UTC


def test_book_reserves_all_or_none_charges_once_and_settles(book: BudgetBook) -> None:
    book.set(Budget("a", 10.0, "month"), "alice", NOW)
    book.set(Budget("b", 100.0, "week", hard=False, alerts=(50,)), "bob", NOW)
    assert book.reserve([("i1", "a", 6.0), ("i1", "b", 500.0)], NOW) is None  # b is soft
    assert book.reserve([("i1", "a", 6.0)], NOW) is None  # the same key again: no-op
    no = book.reserve([("i2", "a", 4.5)], NOW)
    assert no is not None and (no.team, no.spent, no.reserved, no.cap) == ("a", 0, 6.0, 10.0)
    assert no.over_by == pytest.approx(0.5)
    assert book.reserved() == {"a": 6.0, "b": 500.0}
    assert book.charge("i1", 7, [part("a", 2.0), part("b", 60.0)], NOW)
    assert not book.charge("i1", 7, [part("a", 2.0)], NOW)  # booked before
    assert not book.charge("i1", 6, [part("a", 2.0)], NOW)  # an earlier interval
    assert book.spent("a")[window_ids(NOW)["month"]] == 2.0
    assert book.reserved()["a"] == pytest.approx(4.0)
    assert book.reserve([("i2", "a", 4.5)], NOW) is not None  # 2 + 4 + 4.5 > 10
    assert book.reserve([("i2", "a", 4.0)], NOW) is None
    book.settle("i1")
    book.settle("i1")
    assert book.reserved()["a"] == pytest.approx(4.0) and book.reserved()["b"] == 0
    assert book.charged_upto("i1") == -1 and "i1" in book.settled()
    assert not book.charge("i1", 8, [part("a", 1.0)], NOW)  # settled: nothing more
    assert book.fire_alerts("b", NOW) == [50.0] and book.fire_alerts("b", NOW) == []
    assert book.status("a", NOW)["left"] == pytest.approx(10 - 2 - 4)
    caps, committed = book.committed(NOW)
    assert set(caps) == {"a", "b"} and committed["a"] == pytest.approx(2 + 4)
    assert book.remove("a", "carol", NOW) and not book.remove("a", "carol", NOW)
    assert [(h["team"], h["action"], h["who"]) for h in book.history()] == [
        ("a", "set", "alice"), ("b", "set", "bob"), ("a", "rm", "carol")]


def test_split_by_gpu_seconds_idle_to_the_launching_team() -> None:
    # 4 GPUs for an hour at $4/h; team x holds 2 GPUs for 30 min, y 1 GPU all along
    uses = [Use("x", 2, 0.0, 1800.0), Use("y", 1, -5.0, None)]
    parts = {p.team: p for p in split(4.0, 4, 0.0, H, uses, {"x": 1.0}, "s")}
    assert parts["x"].gpu_s == 3600 and parts["y"].gpu_s == 3600
    assert parts["x"].idle_s == 4 * H - 7200 and parts["y"].idle_s == 0
    assert parts["x"].usd == pytest.approx(3.0) and parts["y"].usd == pytest.approx(1.0)
    assert sum(p.usd for p in split(4.0, 4, 0.0, H, [], {}, "s")) == pytest.approx(4.0)



# (GPUs of each team's jobs, GPUs per machine) -> each team's reserved part of the launch
SHARE_ROWS: dict[str, tuple[dict[str, int], int, dict[str, float]]] = {
    "one team fills the machine": ({"x": 4}, 4, {"x": 1.0}),
    "one team on half the machine pays for the idle half too": ({"x": 2}, 4, {"x": 1.0}),
    "two teams, half each: 3/4 each": ({"x": 2, "y": 2}, 4, {"x": 0.75, "y": 0.75}),
    "3 GPUs and 1 on 8": ({"x": 3, "y": 1}, 8, {"x": (3 + 5 * 0.75) / 8,
                                                 "y": (1 + 7 * 0.25) / 8}),
    "a gang wider than one machine": ({"x": 16, "y": 1}, 8, {"x": 1.0,
                                                            "y": (1 + 7 / 17) / 8}),
    "no machine size: by GPUs alone": ({"x": 2, "y": 2}, 0, {"x": 0.5, "y": 0.5}),
}


def team_job(team: str, gpus: int) -> Job:
    from dataclasses import replace

    from tests.builders import job

    j = job(f"{team}-job", gpus)
    return replace(j, spec=j.spec.model_copy(update={"team": team}))


@pytest.mark.parametrize("name", SHARE_ROWS)
def test_a_team_reserves_the_most_the_ledger_can_charge_it(name: str) -> None:
    from policies.burst.budget import shares

    teams, machine_gpus, want = SHARE_ROWS[name]
    got = shares([team_job(t, g) for t, g in teams.items()], 100.0, machine_gpus)
    assert got == pytest.approx({t: 100.0 * f for t, f in want.items()})


def test_the_reserved_part_bounds_the_ledger_s_worst_split() -> None:
    """Team x's 2 GPUs run the whole hour on a 4-GPU machine launched for x and y (2 GPUs
    each); y's job ends at once: the ledger charges x 3/4 of the machine, its reserved part."""
    from policies.burst.budget import shares

    x, y = team_job("x", 2), team_job("y", 2)
    parts = {p.team: p.usd for p in split(4.0, 4, 0.0, H, [Use("x", 2, 0.0, None)],
                                          {"x": 2, "y": 2}, "s")}
    assert parts["x"] == pytest.approx(3.0)
    assert shares([x, y], 4.0, 4)["x"] == pytest.approx(3.0)

def machine(ended: float | None) -> Instance:
    inst = Instance("r1", "aws:r:ondemand/t", requested_at=NOW, price_per_hour=2.0,
                    node_id="n1", for_jobs=("j",),
                    history=(StateChange(InstanceState.REQUESTED, NOW, ""),))
    inst = inst.moved(InstanceState.BOOTING, NOW + 100, "")
    return inst.moved(InstanceState.TERMINATED, ended, "") if ended else inst


def test_charges_hour_by_hour_once_and_settles_the_rest(book: BudgetBook) -> None:
    book.set(Budget("x", 10.0, "total"), "a", NOW)
    assert book.reserve([("r1", "x", 5.0)], NOW) is None
    uses = [Use("x", 1, NOW + 200, None)]
    live = machine(None)
    assert charge_instance(book, live, 2.0, 1, uses, {"x": 1}, NOW + 1.5 * H) == {"x"}
    assert charge_instance(book, live, 2.0, 1, uses, {"x": 1}, NOW + 1.5 * H) == set()
    assert book.spent("x")["total"] == pytest.approx(2.0 * (H - 100) / H)
    ended = machine(NOW + 2.5 * H)
    charge_instance(book, ended, 2.0, 1, uses, {"x": 1}, NOW + 9 * H)  # a restarted pass
    charge_instance(book, ended, 2.0, 1, uses, {"x": 1}, NOW + 9 * H)
    assert book.spent("x")["total"] == pytest.approx(2.0 * (2.5 * H - 100) / H)
    assert book.reserved()["x"] == pytest.approx(0.0)
    sums = book.sums()
    assert sum(v[0] for v in sums.values()) == pytest.approx(book.spent("x")["total"])
    assert {k[1] for k in sums} == {"aws:r:ondemand"}


def test_a_refused_launch_leaves_the_plan_with_the_reason() -> None:
    book = MemoryBudgets()
    book.set(Budget("t", 5.0, "total"), "a", NOW)
    plan = Plan(launches=(Launch("o", 2, "req", ("j1",), (("t", 4.0),)),
                          Launch("o", 1, "req2", ("j2",), (("t", 2.0),))))
    kept = reserve_plan(book, plan, NOW)
    assert [x.request_id for x in kept.launches] == ["req"]
    assert kept.pending["j2"].code == "BudgetExhausted"
    assert "over the cap by $1.00" in kept.pending["j2"].message
    assert sorted(r.key for r in book.reservations()) == ["req-1", "req-2"]


def test_the_read_api_sums_by_team_site_and_day() -> None:
    from broker.money.ledger_report import spend_by, spend_rows

    book = MemoryBudgets()
    book.charge("i1", 1, [Part("a", 2.0, 3600, 0, "s1", "2026-11-30"),
                          Part("b", 1.0, 0, 1800, "s1", "2026-11-30")], NOW)
    book.charge("i2", 1, [Part("a", 4.0, 7200, 0, "s2", "2026-12-01")], NOW)
    assert [(r.team, r.day, r.gpu_hours) for r in spend_rows(book, month="2026-11")] == [
        ("a", "2026-11-30", 1.0), ("b", "2026-11-30", 0.0)]
    by_team = spend_by(book, "team")
    assert (by_team["a"].usd, by_team["a"].gpu_hours, by_team["b"].idle_gpu_hours) == (
        6.0, 3.0, 0.5)
    assert list(spend_by(book, "site", since="2026-12-01")) == ["s2"]
    with pytest.raises(ValueError, match=r"^by: "):
        spend_by(book, "zone")


def test_the_lifecycle_pass_charges_a_store_once_however_often_it_runs() -> None:
    from broker.cycle.plan import Start
    from broker.model import Allocation, Gpu, JobSpec, Node
    from broker.money.ledger import accrue_store
    from broker.store import MemoryStore
    from broker.store.budgets import budget_book
    from broker.store.events import Exited, Started

    store = MemoryStore()
    t0 = 1_800_000_000.0  # (an hour boundary: 500,000 h)
    node = Node("cloud-1", (Gpu("g0", 0, "A100-80GB", 80), Gpu("g1", 1, "A100-80GB", 80)),
                site="aws:r:ondemand", instance_id="i-1")
    store.heartbeat(node, 1e9, t0)
    job = store.submit(JobSpec(command="true", gpus=1, team="vision"), t0)
    store.record_instances([Instance("r1", "aws:r:ondemand/t", requested_at=t0,
                                     price_per_hour=2.0,
                                     history=(StateChange(InstanceState.REQUESTED, t0, ""),))])
    store.move_instance("r1", InstanceState.BOOTING, t0, "launched")
    store.move_instance("r1", InstanceState.READY, t0 + 600, "up", node_id="cloud-1")
    store.apply(Plan(starts=(Start(job.id, 1, job.version, (Allocation("cloud-1", ("g0",), 0),)),
                             )), t0 + 600)
    store.report(job.id, 1, Started(0), t0 + 600)
    store.report(job.id, 1, Exited(0, 0), t0 + 2400)  # 30 min on 1 of the 2 GPUs
    store.move_instance("r1", InstanceState.TERMINATED, t0 + 3600, "idle")
    # three passes (a pass repeated, or restarted) charge nothing twice
    book = budget_book(store)
    book.set(Budget("vision", 1.0, "total", alerts=(40, 60)), "finance", t0)
    fired = [accrue_store(store, book, t0 + 7200).alerts for _ in range(3)]
    assert fired == [[("vision", 40.0)], [], []]  # $0.50 of $1: once
    sums = {k[0]: v for k, v in book.sums().items()}
    assert sums["vision"] == pytest.approx((2.0 * 0.25, 1800.0, 0.0))  # $2/h x 1/2 x 1/2 h
    assert sums["_operator"][0] == pytest.approx(2.0 - 0.5)  # the rest: launched by hand
    assert book.charged_upto("r1") == -1
