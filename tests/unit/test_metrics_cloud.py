"""The cloud series (broker/metrics/cloud.py): what the leader's snapshot says of the rented
machines, and what the provisioner counts (launches, failures by reason, boot timeouts,
orphans found and reaped). tests/integration/test_cloud_metrics.py scrapes them from a real
scheduler."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from broker.bus.runtime import Runtime
from broker.cloud.provisioner import Provisioner
from broker.config.core import Config
from broker.config.providers import parse_providers
from broker.cycle.plan import Applied, Plan, Snapshot
from broker.metrics.cloud import CloudMetrics, instance_gauges
from broker.metrics.scheduler import SchedulerMetrics
from broker.model import Instance, InstanceState
from providers.base import FailOver, Retry, Stop
from tests.unit.test_provider_local import SLEEPER, Faulty, local, requested

S = InstanceState


def inst(rid: str, *moves: tuple[InstanceState, float], price: float = 2.0) -> Instance:
    i = Instance(rid, "local:home:home-a:ondemand/x", requested_at=100.0, price_per_hour=price)
    for state, at in moves:
        i = i.moved(state, at, "test")
    return i


def sample(reg: CollectorRegistry, name: str, **labels: str) -> float | None:
    return reg.get_sample_value(name, labels)


def test_instance_gauges_count_each_live_state_its_oldest_and_the_billed_price() -> None:
    records = [inst("a"),  # REQUESTED since 100
               inst("b", (S.BOOTING, 110.0)),
               inst("c", (S.BOOTING, 130.0), price=5.0),
               inst("d", (S.BOOTING, 105.0), (S.READY, 120.0), price=7.0),
               inst("e", (S.BOOTING, 105.0), (S.FAILED, 121.0), price=11.0)]  # ended: nothing
    count, oldest, spend = instance_gauges(200.0, records)
    assert count == {"REQUESTED": 1, "BOOTING": 2, "READY": 1, "DRAINING": 0}
    assert oldest == {"REQUESTED": 100.0, "BOOTING": 90.0, "READY": 80.0, "DRAINING": 0.0}
    assert spend == 2.0 + 5.0 + 7.0  # the REQUESTED one is not billed yet


def test_the_leader_exports_every_state_and_removes_them_when_it_follows() -> None:
    m = SchedulerMetrics(Config().classes)
    reg = m.registry
    assert sample(reg, "spillway_orphan_instances") == 0  # before any pass
    snap = Snapshot(now=200.0, pending=(), active=(), nodes=(), allocated={}, classes=(),
                    instances=(inst("b", (S.BOOTING, 110.0), price=3.5),))
    m.observe_leadership(True)
    m.observe_cycle(snap, Plan(), Applied(), {})
    assert [sample(reg, "spillway_instances", state=s) for s in
            ("REQUESTED", "BOOTING", "READY", "DRAINING")] == [0, 1, 0, 0]
    assert sample(reg, "spillway_instances_oldest_seconds", state="BOOTING") == 90.0
    assert sample(reg, "spillway_cloud_spend_dollars_per_hour") == 3.5
    m.cloud.observe_orphans(2, {})
    m.observe_leadership(False)
    assert sample(reg, "spillway_instances", state="BOOTING") is None
    assert sample(reg, "spillway_instances_oldest_seconds", state="BOOTING") is None
    assert sample(reg, "spillway_cloud_spend_dollars_per_hour") == 0
    assert sample(reg, "spillway_orphan_instances") == 0


@pytest.fixture
def prov(tmp_path: Path) -> Iterator[tuple[Provisioner, Faulty, dict[str, float]]]:
    cfg = Config(providers=parse_providers({"local": {"boot_timeout_s": 60}}),
                 cluster_name="unit")
    faulty = Faulty(local(tmp_path))
    clock = {"now": 1000.0}
    p = Provisioner(Runtime(cfg, "memory://"), {"local": faulty}, clock=lambda: clock["now"],
                    metrics=CloudMetrics())
    try:
        yield p, faulty, clock
    finally:
        faulty.inner.terminate(list(faulty.inner.instances()))


def test_the_provisioner_counts_launches_and_failures_by_reason(
        prov: tuple[Provisioner, Faulty, dict[str, float]]) -> None:
    p, faulty, _ = prov
    reg = p.metrics.registry
    assert sample(reg, "spillway_instance_launches_total", provider="local") == 0
    offer_id = faulty.inner.offer.id
    for rid in ("r1", "r2", "r3", "r4"):
        requested(p, rid, offer_id)
    requested(p, "r5", "local:home:home-a:ondemand/none")
    assert p.launch_one("r1").state is S.BOOTING  # type: ignore[union-attr]
    faulty.fail = Stop("local", "bad credentials", code="AuthFailure")
    p.launch_one("r2")
    faulty.fail = Retry("local", "throttled", code="RequestLimitExceeded")
    with pytest.raises(Retry):
        p.launch_one("r3")
    p.give_up("r3", 1, faulty.fail)
    p.give_up("r3", 1, faulty.fail)  # (already failed: not counted twice)
    p.launch_one("r5")
    faulty.fail = FailOver("local", "no capacity", code="InsufficientInstanceCapacity")
    p.launch_one("r4")
    assert sample(reg, "spillway_instance_launches_total", provider="local") == 1
    failures = {reason: sample(reg, "spillway_instance_launch_failures_total",
                               provider="local", reason=reason)
                for reason in ("AuthFailure", "gave-up", "no-offer",
                               "InsufficientInstanceCapacity")}
    assert failures == dict.fromkeys(failures, 1.0)


def test_a_boot_timeout_is_a_failure_and_an_orphan_is_found_then_reaped(
        prov: tuple[Provisioner, Faulty, dict[str, float]]) -> None:
    p, faulty, clock = prov
    reg = p.metrics.registry
    requested(p, "r1", faulty.inner.offer.id)
    assert p.launch_one("r1").state is S.BOOTING  # type: ignore[union-attr]
    faulty.inner.launch(faulty.inner.offer, 1, "stray", SLEEPER)  # nobody asked for it
    done = p.reconcile()
    assert done["orphans"] == 1
    assert sample(reg, "spillway_orphan_instances") == 1
    assert sample(reg, "spillway_orphans_reaped_total", provider="local") == 1
    clock["now"] += 61  # past boot_timeout_s, no agent registered
    done = p.reconcile()
    assert done["boot_timeouts"] == 1 and "orphans" not in done
    assert sample(reg, "spillway_orphan_instances") == 0  # the stray is gone
    assert sample(reg, "spillway_instance_launch_failures_total", provider="local",
                  reason="boot-timeout") == 1
    assert sample(reg, "spillway_instance_boot_seconds_count", provider="local") == 0


def test_a_machine_that_registers_records_its_boot_time(
        prov: tuple[Provisioner, Faulty, dict[str, float]]) -> None:
    from broker.cloud.lifecycle import Step

    p, faulty, clock = prov
    requested(p, "r1", faulty.inner.offer.id)  # at 990
    p.launch_one("r1")
    clock["now"] = 1042.5
    step = Step("local", "r1", S.READY, "agent registered as node n1", node_id="n1",
                count="ready")
    assert p._carry_out(step, clock["now"])
    assert p._carry_out(step, clock["now"] + 1)  # (already READY: no second boot time)
    reg = p.metrics.registry
    assert sample(reg, "spillway_instance_boot_seconds_count", provider="local") == 1
    assert sample(reg, "spillway_instance_boot_seconds_sum", provider="local") == 52.5

