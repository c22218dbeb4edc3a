"""The actuator's cloud half: a Plan's launches become REQUESTED instance records (one per
machine, idempotent by request id, fenced with the plan) before they are sent."""

from __future__ import annotations

import pytest

from broker.bus import commands
from broker.config.core import Config
from broker.config.providers import parse_providers
from broker.cycle.actuator import apply_plan
from broker.cycle.plan import Launch, Plan
from broker.errors import Fenced
from broker.model import InstanceState, Market, Offer
from tests.unit.test_commands import runtime

OFFER = Offer("local", "home", "home-a", "t1", "A100-80GB", 2, 80.0, Market.ONDEMAND, 4.0)


def test_launches_are_recorded_once_per_machine_then_sent() -> None:
    rt, fake = runtime(Config(providers=parse_providers({"local": {}})))
    fake.store.publish_offers([OFFER], 0.0)
    plan = Plan(launches=(Launch(OFFER.id, 2, "burst-1", ("j-1", "j-2")),))
    apply_plan(rt, plan)
    apply_plan(rt, plan)  # the same plan again (a retried cycle): recorded once
    recs = fake.store.instances()
    assert [r.request_id for r in recs] == ["burst-1-1", "burst-1-2"]
    assert {r.state for r in recs} == {InstanceState.REQUESTED}
    assert recs[0].price_per_hour == 4.0 and recs[0].for_jobs == ("j-1", "j-2")
    assert recs[0].reason == "requested for 2 job(s): j-1, j-2"
    assert [(n, a) for n, a, _ in fake.celery.sent] == [
        (commands.LAUNCH, [OFFER.id, 2, "burst-1", ["j-1", "j-2"]])] * 2


def test_a_deposed_leader_records_no_launch() -> None:
    rt, fake = runtime(Config(providers=parse_providers({"local": {}})))
    old = fake.store.acquire_leadership("a", 1.0, 0.0)
    assert old is not None
    fake.store.release_leadership(old)
    assert fake.store.acquire_leadership("b", 10.0, 1.0) is not None
    with fake.store.fenced(old), pytest.raises(Fenced):
        apply_plan(rt, Plan(launches=(Launch(OFFER.id, 1, "burst-2", ()),)))
    assert fake.store.instances() == [] and fake.celery.sent == []
