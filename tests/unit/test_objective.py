"""The placement objective (policies/carbon/objective.py) and how it ranks cloud offers
(policies/burst/offers.py ``rank_value``): one row per rule."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import pytest

from broker.errors import ConfigError
from broker.model import Offer
from broker.model.cloud import Market
from policies.burst.offers import rank_value
from policies.carbon.objective import Objective, expected_kg, mean_intensity, work_hours
from policies.registry import settings_of
from policies.settings import check_settings
from tests.unit.test_preemption import pending

H = 3600.0
NOW = 10_000.0


def offer(region: str, zone: str, model: str = "V100-16GB", price: float = 3.06) -> Offer:
    return Offer("aws", region, "", f"p.{model}", model, 1, 16, Market("ondemand"), price,
                 carbon_zone=zone)


@dataclass
class _Snap:
    carbon_forecast: dict[str, tuple[tuple[float, float], ...]] = field(default_factory=dict)
    carbon: dict[str, float] = field(default_factory=dict)


@dataclass
class _Cycle:
    """What rank_value reads of a cycle."""

    weights: dict[str, Any]
    snap: _Snap = field(default_factory=_Snap)
    now: float = NOW

    def settings(self, name: str) -> dict[str, Any]:
        return settings_of({"objective": self.weights}, name)


# (weights, usd, kg, late GPU-hours, value)
VALUES: dict[str, tuple[dict[str, float], float, float, float, float]] = {
    "dollars only": ({}, 10.0, 50.0, 2.0, 10.0),
    "carbon at $100/t": ({"carbon_usd_per_tonne": 100}, 10.0, 50.0, 0.0, 15.0),
    "lateness at $3/GPU-h": ({"late_usd_per_gpu_hour": 3}, 10.0, 0.0, 2.0, 16.0),
    "all three, dollars halved": ({"usd_weight": 0.5, "carbon_usd_per_tonne": 200,
                                   "late_usd_per_gpu_hour": 1}, 10.0, 10.0, 1.0, 8.0),
}


@pytest.mark.parametrize("name", VALUES)
def test_value(name: str) -> None:
    weights, usd, kg, late, want = VALUES[name]
    assert Objective.of(weights).value(usd, kg, late) == pytest.approx(want)


def test_per_unit_of_work_counts_gpu_speed() -> None:
    # an hour on one V100 is one V100-hour of work; an hour on an H100 is several
    assert work_hours(1, H, "V100-16GB") == pytest.approx(1.0)
    assert work_hours(2, H, "V100-32GB") == pytest.approx(2.0)
    h100 = work_hours(1, H, "H100-80GB")
    assert h100 > 2.0
    obj = Objective()
    # $4 for an H100-hour beats $2 for a V100-hour per unit of work
    assert obj.per_work(4.0, 0.0, 0.0, h100) < obj.per_work(2.0, 0.0, 0.0, 1.0)
    assert obj.per_work(1.0, 0.0, 0.0, 0.0) == float("inf")


@pytest.mark.parametrize("bad", [{"carbon_usd_per_tonne": -1}, {"usd_weight": float("nan")}])
def test_weights_are_checked(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError, match=r"objective .*not allowed; use a number >= 0"):
        Objective.of(bad)
    key = next(iter(bad))
    with pytest.raises(ConfigError, match=f"settings.objective.{key}"):
        check_settings({"objective": bad}, "settings")
    with pytest.raises(ConfigError, match="'carbon_price' is not a setting of 'objective'"):
        check_settings({"objective": {"carbon_price": 5}}, "settings")


def test_expected_intensity_and_emissions() -> None:
    steps = ((0.0, 100.0), (H, 300.0))
    assert mean_intensity("A", 0.0, 2 * H, {"A": steps}, {}) == pytest.approx(200.0)
    assert mean_intensity("A", 5.0, 5.0, {"A": steps}, {}) == 100.0
    assert mean_intensity("B", 0.0, H, {"A": steps}, {"B": 42.0}) == 42.0
    assert mean_intensity("ES", 0.0, H, {}, {}) is None  # (signals carry yearly averages)
    assert mean_intensity("XX-NOWHERE", 0.0, H, {}, {}) is None
    # one V100 (300 W, host share 0.46) on AWS (PUE 1.15) for an hour at 200 g/kWh
    assert expected_kg(1, "V100-16GB", "aws:us-east-1:ondemand", 200.0, H) == pytest.approx(
        0.3 * 1.46 * 1.15 * 0.2)
    assert expected_kg(1, "V100-16GB", "aws:us-east-1:ondemand", None, H) == 0.0


# two hours of one V100 on AWS draw 1.0 kWh: 0.45 kg in PJM against 0.05 kg in BPAT, worth
# 2 cents at $50 a tonne, more than the 1 cent the cleaner offer costs more
CLEAN = offer("us-west-2", "US-NW-BPAT", price=3.065)
DIRTY = offer("us-east-1", "US-MIDA-PJM")
FORECAST = {"US-NW-BPAT": ((0.0, 50.0),), "US-MIDA-PJM": ((0.0, 450.0),)}

# (weights, forecast, offers, the one ranked first)
RANKS = {
    "default weights: the cheaper in dollars": ({}, FORECAST, (CLEAN, DIRTY), DIRTY),
    "$50/t: the cleaner at a cent more": ({"carbon_usd_per_tonne": 50}, FORECAST,
                                                (CLEAN, DIRTY), CLEAN),
    "$50/t, no forecast, no signal: yearly averages unknown, dollars decide": (
        {"carbon_usd_per_tonne": 50}, {}, (offer("x", "XX-A", price=3.065), offer("y", "XX-B")),
        offer("y", "XX-B")),
    "$1/t: too little to pay a cent for": ({"carbon_usd_per_tonne": 1}, FORECAST,
                                                     (CLEAN, DIRTY), DIRTY),
}


@pytest.mark.parametrize("name", RANKS)
def test_rank_of_offers(name: str) -> None:
    weights, forecast, offers, first = RANKS[name]
    cyc: Any = _Cycle(weights, _Snap(dict(forecast)))
    job = pending("p", 1, priority="normal")

    def rank(o: Offer) -> float:
        usd = o.price_per_hour * 2
        return rank_value(cyc, job, o, usd, 2 * H, NOW + H, 60.0)

    assert min(offers, key=rank) == first


def test_default_weights_rank_by_the_dollars_themselves() -> None:
    cyc: Any = _Cycle({}, _Snap(dict(FORECAST)))
    job = pending("p", 4, priority="normal")
    for usd in (0.0, 1e-9, 3.0600000000000005, 12345.678):
        assert rank_value(cyc, job, DIRTY, usd, 2 * H, NOW - H, 240.0) == usd


def test_lateness_prefers_the_faster_boot_once_the_sla_is_lost() -> None:
    cyc: Any = _Cycle({"late_usd_per_gpu_hour": 100})
    job = pending("p", 1, priority="normal")
    slow = rank_value(cyc, job, DIRTY, 6.0, 2 * H, NOW - 60, 1800.0)
    fast = rank_value(cyc, job, DIRTY, 6.5, 2 * H, NOW - 60, 60.0)
    assert fast < slow


def test_the_burst_phase_ranks_offers_by_the_objective() -> None:
    from broker.cycle.scheduler import run_cycle
    from policies.registry import PolicySet
    from tests.builders import node
    from tests.unit.test_burst import late
    from tests.unit.test_burst import offer as burst_offer
    from tests.unit.test_preemption import running, snap

    dirty = replace(burst_offer("ondemand", zone="us-east-1a"), carbon_zone="US-MIDA-PJM")
    clean = replace(burst_offer("ondemand", zone="us-west-2a", price=3.07),
                    carbon_zone="US-NW-BPAT")

    def chosen(weights: dict[str, Any]) -> str:
        s = snap([node("a", 4)], [late()], [running("r", 4, time_limit=20 * H)],
                 offers=(dirty, clean), settings={"objective": weights},
                 carbon_forecast=dict(FORECAST))
        return run_cycle(s, PolicySet(burst="sla", name="t")).launches[0].offer_id

    assert chosen({}) == dirty.id  # the cheaper, as by dollars alone
    assert chosen({"carbon_usd_per_tonne": 100}) == clean.id
