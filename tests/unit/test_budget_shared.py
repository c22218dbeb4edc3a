"""A job that starts on a machine rented for another team's job (policies/burst/budget.py
``_starts``, broker/money/ledger.py): it reserves its own GPUs' share for its team, and the idle
GPUs
it may keep up for the teams the machine was launched for, who pay them (the ledger's rule).
However long it keeps the machine up, the launching team's charges stay within what was
reserved for it."""

from __future__ import annotations

import pytest

from broker.cycle.scheduler import run_cycle
from broker.model import Instance, InstanceState, StateChange
from broker.money.ledger import Use, charge_instance, reserve_plan
from broker.store.budgets import Budget, with_budgets
from broker.store.budgets_memory import MemoryBudgets
from policies.burst.budget import LAUNCHERS
from policies.registry import PolicySet
from tests.builders import node
from tests.unit.test_burst import offer
from tests.unit.test_preemption import NOW, pending, running, snap

H = 3600.0
CLOUD = "aws:us-east-1:ondemand"
OD4 = offer("ondemand", gpus=4, price=4.0, typ="g4")  # $4/h, 4 GPUs, boots in 60 s
SITES = ("onprem", "cloud")


def machine(ended: float | None = None) -> Instance:
    inst = Instance("m1", OD4.id, requested_at=NOW - H, price_per_hour=4.0, node_id="c",
                    for_jobs=("ja",),
                    history=(StateChange(InstanceState.REQUESTED, NOW - H, ""),))
    inst = inst.moved(InstanceState.BOOTING, NOW - H, "").moved(InstanceState.READY, NOW - H,
                                                                 "")
    return inst.moved(InstanceState.TERMINATED, ended, "") if ended else inst


def plan_b(book: MemoryBudgets) -> object:
    """Team a's job holds 1 GPU of the machine; team b's 1-GPU job (limit 5 h) starts there."""
    ja = running("ja", 1, "c", team="a", time_limit=H, sites=SITES)
    jb = pending("jb", 1, team="b", priority="normal", time_limit=5 * H, sites=SITES)
    s = snap([node("c", 4, "V100-16GB", site=CLOUD)], [jb], [ja], offers=(OD4,),
             instances=(machine(),))
    plan = run_cycle(with_budgets(s, book), PolicySet(burst="sla", name="t"), NOW)
    return plan


def test_a_start_reserves_its_share_and_the_launchers_idle_gpus() -> None:
    book = MemoryBudgets()
    book.set(Budget("a", 100.0, "total"), "f", NOW)
    plan = plan_b(book)
    (st,) = plan.starts  # type: ignore[attr-defined]
    assert st.budget == (("c", "b", pytest.approx(4.0 * 0.25 * 5)),
                         ("c", LAUNCHERS, pytest.approx(4.0 * (0.75 * 5 + 300 / H))))
    machine_of = {"c": ("m1", {"a": 1.0})}.get
    kept = reserve_plan(book, plan, NOW, machine_of=machine_of)  # type: ignore[arg-type]
    assert [s.job_id for s in kept.starts] == ["jb"]
    assert book.reserved() == {"b": pytest.approx(5.0), "a": pytest.approx(15 + 4 / 12)}


def test_a_start_that_would_pass_the_launchers_cap_is_refused() -> None:
    book = MemoryBudgets()
    book.set(Budget("a", 10.0, "total"), "f", NOW)  # b's run would cost a ~$15 of idle GPUs
    kept = reserve_plan(book, plan_b(book), NOW,  # type: ignore[arg-type]
                        machine_of={"c": ("m1", {"a": 1.0})}.get)
    assert kept.starts == () and kept.pending["jb"].code == "BudgetExhausted"
    assert "team a's budget" in kept.pending["jb"].message


def test_the_launchers_charges_stay_within_what_was_reserved_for_them() -> None:
    book = MemoryBudgets()
    book.set(Budget("a", 1000.0, "total"), "f", NOW)
    # the launch: the whole machine for a 60 s boot, a's 1 h limit and the 300 s idle tail
    launch = 4.0 * (60 + H + 300) / H
    assert book.reserve([("m1", "a", launch)], NOW - H, "burst-1") is None
    kept = reserve_plan(book, plan_b(book), NOW,  # type: ignore[arg-type]
                        machine_of={"c": ("m1", {"a": 1.0})}.get)
    assert kept.starts
    reserved_a = book.reserved()["a"]
    # a's job ran its hour from boot; b's ran its whole 5 h from NOW; the machine idled 300 s
    uses = [Use("a", 1, NOW - H + 60, NOW + 60), Use("b", 1, NOW, NOW + 5 * H)]
    end = NOW + 5 * H + 300
    charge_instance(book, machine(end), 4.0, 4, uses, {"a": 1.0}, end + H)
    spent = book.spent("a")["total"]
    # billed 6 h 5 min at $4/h, less b's 5 GPU-hours at $1: $19.33 for a; a reserved $4.40
    # with its launch and $15.33 with b's start
    assert spent == pytest.approx(4.0 * (6 + 1 / 12) - 5.0)
    assert spent <= reserved_a + 1e-9 and spent > launch
    assert book.spent("b")["total"] == pytest.approx(4.0 * 0.25 * 5)


def test_a_job_a_cap_keeps_back_does_not_keep_an_idle_machine_up() -> None:
    # no pending job keeps an idle machine up (broker/cloud/lifecycle.py scale_down), so one a hard
    # cap keeps from bursting costs the machine's launchers no idle time past the timeout
    from broker.cloud.lifecycle import NodeUse, Verdict, scale_down

    idle = NodeUse(4, 0, NOW - 300, NOW - 300, NOW - 600, True)
    assert scale_down(NOW, idle, 300.0, lambda: True)[0] is Verdict.DRAIN
