"""What a job that may burst is told while it waits (policies/burst/outlook.py): one row per
case, on the small snapshots of tests/unit/test_burst.py (node ``a``, 4 A100s held by ``r``
until long after every SLA; offers boot in 60 s unless a row says otherwise; margin 300 s)."""

from __future__ import annotations

from typing import Any

import pytest

from broker.client import Explanation
from broker.model import BurstOutlook, Job
from broker.model.state import JobState
from tests.unit.test_burst import NOW, OD, H, cycle, late, offer
from tests.unit.test_preemption import running

CHEAP_SLOW = offer("ondemand", price=1.0, boot=200.0, typ="cheap")
IN_TIME = {"active": [running("r", 4, time_limit=10_000 - 1000 + 50)]}  # frees at NOW + 50

# (queue, cycle kwargs, reason code, outlook fields (None: no outlook), words in the message,
#  words not in it)
ROWS: dict[str, tuple[list[Job], dict[str, Any], str, dict[str, Any] | None, list[str],
                      list[str]]] = {
    "waits; on-prem past its SLA: bursts at its decision time unless on-prem first": (
        [late(left=1000)], {"offers": (OD,)}, "Resources",
        {"burst_at": NOW + 1000 - 60 - 300, "sla_at": NOW + 1000, "onprem_start": 73_000.0,
         "offer_id": OD.id, "market": "ondemand", "price_per_hour": 3.06, "boot_s": 60.0,
         "cloud_only": False},
        ["past its normal SLA (03:03 UTC)", "bursts at 02:57 UTC to aws "
         "us-east-1 ondemand p3.1x ($3.06/h, ~60s to boot) unless it starts on-prem first"], []),
    "waits; on-prem in time: says so, and when it would burst": (
        [late(left=1000)], {"offers": (OD,), **IN_TIME}, "Resources",
        {"burst_at": NOW + 640, "onprem_start": NOW + 50},
        ["forecast to start it at 02:47 UTC, within its normal SLA",
         "if it still waits at 02:57 UTC"],
        ["past its"]),
    "the offer's boot estimate sets its decision time (4 s: not 240 s)": (
        [late(left=1000)], {"offers": (offer("ondemand", boot=4.0),)}, "Resources",
        {"burst_at": NOW + 1000 - 4 - 300, "boot_s": 4.0}, ["~4s to boot"], []),
    "the slowest boot sets the time, the cheapest offer is named": (
        [late(left=1000)], {"offers": (OD, CHEAP_SLOW)}, "Resources",
        {"burst_at": NOW + 1000 - 200 - 300, "offer_id": CHEAP_SLOW.id, "boot_s": 200.0},
        ["$1/h"], []),
    "cloud-only: its own reason, no on-prem wait story": (
        [late(left=1000, sites=("cloud",))], {"offers": (OD,)}, "CloudOnly",
        {"burst_at": NOW + 640, "onprem_start": None, "cloud_only": True},
        ["runs only in the cloud (sites: cloud)", "bursts at 02:57 UTC to aws us-east-1 ondemand",
         "unless a rented machine frees up first"], ["higher-ranked", "on-prem"]),
    "cloud-only, on-prem free: still its own reason": (
        [late(left=1000, sites=("cloud",))], {"offers": (OD,), "active": []}, "CloudOnly",
        {"cloud_only": True}, ["runs only in the cloud"], ["higher-ranked"]),
    "cloud-only, no offer under its max price then": (
        [late(left=1000, sites=("cloud",), max_price_per_hour=0.5)], {"offers": (OD,)},
        "CloudOnly", None, ["could not burst either", "max_price_per_hour"], ["higher-ranked"]),
    "cloud-only, its class may not burst": (
        [late(priority="low", left=1000, sites=("cloud",))], {"offers": (OD,)},
        "ClassMayNotBurst", None, ["runs only in the cloud", "may not burst"], []),
    "may burst, no offer under its max price: the queue's reason alone": (
        [late(left=1000, max_price_per_hour=0.5)], {"offers": (OD,)}, "Resources", None, [],
        ["bursts"]),
    "on-prem only: the queue's reason alone": (
        [late(left=1000, sites=("onprem",))], {"offers": (OD,)}, "Resources", None, [],
        ["bursts"]),
    "bursting now: its Bursting reason, no outlook": (
        [late(left=100)], {"offers": (OD,)}, "Bursting", None, ["breaks its normal SLA"], []),
    "bursting a cloud-only job: no on-prem forecast named": (
        [late(left=100, sites=("cloud",))], {"offers": (OD,)}, "Bursting", None,
        ["it runs only in the cloud; renting"], ["forecast"]),
}


@pytest.mark.parametrize("queue,kwargs,code,fields,said,unsaid", ROWS.values(), ids=ROWS.keys())
def test_what_a_waiting_job_is_told(queue: list[Job], kwargs: dict[str, Any], code: str,
                                    fields: dict[str, Any] | None, said: list[str],
                                    unsaid: list[str]) -> None:
    plan = cycle(queue, **kwargs)
    why = plan.pending["p"]
    assert why.code == code, why
    if fields is None:
        assert why.burst is None
    else:
        assert why.burst is not None
        assert {k: getattr(why.burst, k) for k in fields} == pytest.approx(fields)
    for words in said:
        assert words in why.message
    for words in unsaid:
        assert words not in why.message
    if code == "CloudOnly" and fields is not None:
        assert plan.wake_at == why.burst.burst_at  # type: ignore[union-attr]


def test_the_outlook_changes_no_decision() -> None:
    """The plan of a waiting job is the same whatever it is told: nothing launched, a cycle
    asked at its decision time."""
    plan = cycle([late(left=1000)], offers=(OD,))
    assert plan.launches == () and plan.wake_at == NOW + 640


def test_a_reason_with_its_outlook_round_trips() -> None:
    from broker.model import Reason

    plan = cycle([late(left=1000)], offers=(OD,))
    why = plan.pending["p"]
    assert Reason.from_list(why.to_list()) == why
    assert Reason.from_list(["Resources", "x"]) == Reason("Resources", "x")


OUT = BurstOutlook(burst_at=NOW + 1260, sla_at=NOW + 1800, onprem_start=NOW + 2 * H,
                   offer_id="gcp:us-central1:us-central1-a:spot/a2-highgpu-1g", provider="gcp",
                   region="us-central1", zone="us-central1-a", market="spot",
                   instance_type="a2-highgpu-1g", price_per_hour=1.1, boot_s=4.0)


def explanation(burst: BurstOutlook | None) -> Explanation:
    return Explanation("j-1", "", JobState.PENDING, "t", "high", 300, 1800.0, 1, 60.0, False,
                       "Resources", "no GPU is free", burst=burst)


def test_the_explanation_carries_the_outlook_as_data() -> None:
    out = explanation(OUT).to_dict()
    assert out["burst"]["burst_at"] == NOW + 1260 and out["burst"]["market"] == "spot"
    assert Explanation.from_dict(out) == explanation(OUT)
    assert explanation(None).to_dict()["burst"] is None
    assert Explanation.from_dict(explanation(None).to_dict()).burst is None


# (outlook, rows the panel shows (label, words))
PANEL: dict[str, tuple[BurstOutlook, list[tuple[str, str]]]] = {
    "may run on-prem: the forecast, then the burst": (OUT, [
        ("on-prem start", "(in 2h00m); its SLA breaks at"),
        ("bursts", "(in 21m00s) to gcp us-central1-a spot a2-highgpu-1g, $1.1/h (boots in "
                   "~4.0s), unless it starts on-prem first")]),
    "no on-prem forecast": (BurstOutlook(**{**OUT.to_dict(), "onprem_start": None}), [
        ("on-prem start", "none forecast; its SLA breaks at"), ("bursts", "unless it starts")]),
    "cloud-only: no on-prem row": (BurstOutlook(**{**OUT.to_dict(), "onprem_start": None,
                                                   "cloud_only": True}),
                                   [("bursts", "unless a rented machine frees up first")]),
    "its decision time has come": (BurstOutlook(**{**OUT.to_dict(), "burst_at": NOW - 5}),
                                   [("on-prem start", "forecast"), ("bursts", "(due now)")]),
}


@pytest.mark.parametrize("burst,rows", PANEL.values(), ids=PANEL.keys())
def test_the_explain_panel_rows(burst: BurstOutlook, rows: list[tuple[str, str]]) -> None:
    from broker.cli.render import burst_rows

    got = burst_rows(burst, NOW)
    assert [label for label, _ in got] == [label for label, _ in rows]
    for (_, text), (_, words) in zip(got, rows):
        assert words in text, text


def test_what_is_kept_across_cycles_follows_the_offers() -> None:
    """The offer a waiting job is told (kept across cycles in the scheduler's Memory) is the
    one a fresh cycle names, and changes when the offers do."""
    from broker.cycle.scheduler import run_cycle
    from policies.cycle import Memory
    from tests.builders import node
    from tests.unit.test_burst import SLA
    from tests.unit.test_preemption import snap

    def told(offers: tuple[Any, ...], memory: Memory, now: float = NOW) -> str:
        s = snap([node("a", 4)], [late(left=1000)], [running("r", 4, time_limit=20 * H)],
                 now=now, offers=offers, settings={"sla": {}})
        burst = run_cycle(s, SLA, now, memory).pending["p"].burst
        assert burst is not None
        return burst.offer_id

    memory = Memory()
    cheap = offer("ondemand", price=1.0, typ="cheap")
    assert told((OD, CHEAP_SLOW), memory) == CHEAP_SLOW.id
    assert told((OD, CHEAP_SLOW), memory, NOW + 30) == CHEAP_SLOW.id  # (kept)
    assert told((OD, offer("ondemand", price=1.0, boot=200.0, typ="cheap", available=False)),
                memory, NOW + 60) == OD.id  # (the cheap one is gone)
    assert told((OD, cheap), memory, NOW + 90) == told((OD, cheap), Memory(), NOW + 90)
    assert len(memory.outlooks["memo"]) == 3


def test_a_reason_told_again_is_what_a_fresh_cycle_says() -> None:
    """A waiting job is told last cycle's reason again (the very object, which a store need
    not write again) only while its sentence would be the same: here the outlook stays, but
    its on-prem start comes within 12 hours, and is then shown without its day."""
    from broker.cycle.scheduler import run_cycle
    from policies.cycle import Memory
    from tests.builders import node
    from tests.unit.test_burst import SLA
    from tests.unit.test_preemption import snap

    def told(memory: Memory, now: float) -> Any:
        s = snap([node("a", 4)], [late(left=1000)],
                 [running("r", 4, time_limit=NOW - 1000 + 12 * H + 100)],  # (frees then)
                 now=now, offers=(OD,), settings={"sla": {}})
        return run_cycle(s, SLA, now, memory).pending["p"]

    memory = Memory()
    first = told(memory, NOW)
    assert first.burst.onprem_start == NOW + 12 * H + 100 and "1970-01-01 " in first.message
    assert told(memory, NOW + 30) is first
    later = told(memory, NOW + 200)
    assert later.burst == first.burst and "1970-01-01 " not in later.message
    assert later == told(Memory(), NOW + 200) and later.to_list() == told(
        Memory(), NOW + 200).to_list()
    assert told(memory, NOW + 230) is later
