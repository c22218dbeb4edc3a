"""The machines' lifecycle decisions (broker/cloud/lifecycle.py), table-driven: records, machines
and nodes in; the steps out."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from broker.cloud.lifecycle import NodeUse, Step, Timeouts, Verdict, decide, scale_down
from broker.model import Gpu, Instance, InstanceState, Node, NodeState
from providers.base import CloudMachine

S = InstanceState
OFFER = "local:home:home-a:ondemand/t1"
T = Timeouts(boot_timeout_s=60.0, idle_timeout_s=30.0)
NOW = 1000.0


def rec(rid: str, state: S, at: float = 900.0, pid: str = "", node: str = "") -> Instance:
    inst = Instance(rid, OFFER, requested_at=at)
    path = {S.REQUESTED: [], S.BOOTING: [S.BOOTING], S.READY: [S.BOOTING, S.READY],
            S.DRAINING: [S.BOOTING, S.READY, S.DRAINING]}[state]
    for to in path:
        inst = inst.moved(to, at, "x")
    return Instance.from_dict({**inst.to_dict(), "provider_id": pid, "node_id": node})


def machine(pid: str, rid: str, state: S = S.READY) -> CloudMachine:
    return CloudMachine(pid, rid, state, native_state=state.value.lower())


def node(nid: str, instance: str, lease: float = NOW + 5,
         state: NodeState = NodeState.READY) -> Node:
    return Node(nid, (Gpu(f"{nid}-g0", 0, "A100-80GB", 80.0),), site="local:home:home-a:"
                "ondemand", state=state, lease_expires=lease, instance_id=instance)


def run(records: list[Instance], machines: list[CloudMachine], nodes: Sequence[Node] = (),
        busy: tuple[str, ...] = (), idle: dict[str, float] | None = None,
        known: tuple[str, ...] = ()) -> list[Step]:
    listed = {"local": {m.provider_id: m for m in machines}}
    ids = frozenset([r.request_id for r in records] + list(known))
    return decide(NOW, records, listed, list(nodes), dict.fromkeys(busy, 1), {"local": T},
                  idle or {}, ids).steps


@pytest.mark.parametrize("case, records, machines, nodes, expect", [
    ("requested, machine listed: found by request id -> BOOTING",
     [rec("r1", S.REQUESTED)], [machine("m1", "r1", S.BOOTING)], [],
     [("r1", S.BOOTING, "", "found")]),
    ("requested, nothing listed, young: wait",
     [rec("r1", S.REQUESTED, at=990.0)], [], [], []),
    ("requested, nothing listed past the boot timeout: FAILED",
     [rec("r1", S.REQUESTED, at=900.0)], [], [], [("r1", S.FAILED, "", "failed")]),
    ("booting, agent registered: READY",
     [rec("r1", S.BOOTING, pid="m1")], [machine("m1", "r1")], [node("m1", "m1")],
     [("r1", S.READY, "", "ready")]),
    ("booting, young, no agent: wait",
     [rec("r1", S.BOOTING, at=980.0, pid="m1")], [machine("m1", "r1")], [], []),
    ("booting past the boot timeout: terminate, FAILED, block",
     [rec("r1", S.BOOTING, at=900.0, pid="m1")], [machine("m1", "r1")], [],
     [("r1", S.FAILED, "m1", "boot_timeouts")]),
    ("booting, a node with an expired lease is no registration: boot timeout",
     [rec("r1", S.BOOTING, at=900.0, pid="m1")], [machine("m1", "r1")],
     [node("m1", "m1", lease=NOW - 1)], [("r1", S.FAILED, "m1", "boot_timeouts")]),
    ("ready, the provider no longer lists it: TERMINATED (vanished)",
     [rec("r1", S.READY, pid="m1", node="m1")], [], [node("m1", "m1")],
     [("r1", S.TERMINATED, "", "vanished")]),
    ("ready, the provider lists it dead: TERMINATED (vanished)",
     [rec("r1", S.READY, pid="m1", node="m1")], [machine("m1", "r1", S.TERMINATED)],
     [node("m1", "m1")], [("r1", S.TERMINATED, "", "vanished")]),
    ("booting since the listing began (launched meanwhile), not listed: next pass",
     [rec("r1", S.BOOTING, at=NOW, pid="m1")], [], [], []),
    ("booting before the listing began, not listed: TERMINATED (vanished)",
     [rec("r1", S.BOOTING, at=NOW - 0.5, pid="m1")], [], [],
     [("r1", S.TERMINATED, "", "vanished")]),
    ("ready, its node's lease expired: terminate (lost, not an orphan: it has a record)",
     [rec("r1", S.READY, pid="m1", node="m1")], [machine("m1", "r1")],
     [node("m1", "m1", lease=NOW - 1, state=NodeState.DOWN)],
     [("r1", S.TERMINATED, "m1", "lost")]),
    ("draining, no job left: terminate",
     [rec("r1", S.DRAINING, pid="m1", node="m1")], [machine("m1", "r1")],
     [node("m1", "m1", state=NodeState.DRAINING)], [("r1", S.TERMINATED, "m1", "released")]),
    ("a machine whose request id the store never knew: an orphan",
     [], [machine("m9", "r9")], [], [("r9", None, "m9", "orphans")]),
    ("a machine already gone is no orphan",
     [], [machine("m9", "r9", S.TERMINATED)], [], []),
])
def test_the_lifecycle_table(case: str, records: list[Instance], machines: list[CloudMachine],
                             nodes: list[Node], expect: list[tuple[str, S | None, str, str]]
                             ) -> None:
    steps = run(records, machines, nodes)
    assert [(s.request_id, s.move, s.terminate, s.count) for s in steps] == expect, case


def test_a_boot_timeout_cools_the_zone_down() -> None:
    [step] = run([rec("r1", S.BOOTING, at=900.0, pid="m1")], [machine("m1", "r1")])
    assert step.block and "boot timeout" in step.reason


def test_idle_is_timed_across_passes_and_reset_by_work() -> None:
    r = [rec("r1", S.READY, pid="m1", node="m1")]
    m, n = [machine("m1", "r1")], [node("m1", "m1", lease=NOW + 100)]
    listed = {"local": {x.provider_id: x for x in m}}
    first = decide(NOW, r, listed, n, {}, {"local": T}, {}, frozenset({"r1"}))
    assert first.steps == [] and first.idle_since == {"m1": NOW}
    later = decide(NOW + 31, r, listed, n, {}, {"local": T}, first.idle_since,
                   frozenset({"r1"}))
    [drain] = later.steps
    assert (drain.move, drain.drain, drain.count) == (S.DRAINING, "m1", "idle")
    busy = decide(NOW + 31, r, listed, n, {"m1": 1}, {"local": T}, first.idle_since,
                  frozenset({"r1"}))
    assert busy.steps == [] and busy.idle_since == {}  # a job ran: the clock starts again


def test_a_draining_node_with_jobs_is_left_to_finish() -> None:
    assert run([rec("r1", S.DRAINING, pid="m1", node="m1")], [machine("m1", "r1")],
               [node("m1", "m1", state=NodeState.DRAINING)], busy=("m1",)) == []


def test_a_provider_whose_listing_failed_is_not_judged() -> None:
    records = [rec("r1", S.READY, pid="m1", node="m1")]
    out = decide(NOW, records, {}, [], {}, {"local": T}, {}, frozenset({"r1"}))
    assert out.steps == []


def test_a_machine_whose_record_ended_is_an_orphan() -> None:
    [step] = run([], [machine("m9", "r9")], known=("r9",))
    assert (step.terminate, step.count) == ("m9", "orphans") and "ended" in step.reason


def test_a_launch_lost_with_its_message_is_sent_again() -> None:
    slow = Timeouts(boot_timeout_s=600.0, idle_timeout_s=30.0)
    young, old = rec("r1", S.REQUESTED, at=NOW - 30), rec("r2", S.REQUESTED, at=NOW - 90)
    out = decide(NOW, [young, old], {"local": {}}, [], {}, {"local": slow}, {},
                 frozenset({"r1", "r2"}))
    assert [(s.request_id, s.resend, s.move) for s in out.steps] == [("r2", True, None)]


@pytest.mark.parametrize("site, sites, allowed", [
    ("onprem", ("onprem",), True),
    ("onprem", ("cloud", "spot"), False),
    ("local:home:home-a:ondemand", ("cloud",), True),
    ("local:home:home-a:ondemand", ("spot",), False),
    ("aws:us-east-1:us-east-1a:spot", ("spot",), True),
    ("aws:us-east-1:us-east-1a:spot", ("onprem", "cloud"), False),
    ("aws:us-east-1:spot", ("onprem", "cloud", "spot"), True),
])
def test_a_cloud_node_admits_jobs_by_its_site_kind(site: str, sites: tuple[str, ...],
                                                   allowed: bool) -> None:
    from broker.model import Site
    from broker.model.fit import site_allows

    assert site_allows(site, sites) is allowed
    assert (Site.parse(site).kind in sites or site in sites) is allowed


def test_an_idle_node_is_drained_even_with_jobs_pending() -> None:
    r = [rec("r1", S.READY, pid="m1", node="m1")]
    listed = {"local": {"m1": machine("m1", "r1")}}
    n = [node("m1", "m1", lease=NOW + 100)]
    [step] = decide(NOW + 31, r, listed, n, {}, {"local": T}, {"m1": NOW},
                    frozenset({"r1"})).steps
    assert (step.move, step.drain, step.count) == (S.DRAINING, "m1", "idle")


def test_a_drained_node_with_no_job_left_goes() -> None:
    r = [rec("r1", S.DRAINING, pid="m1", node="m1")]
    listed = {"local": {"m1": machine("m1", "r1")}}
    n = [node("m1", "m1", state=NodeState.DRAINING)]
    [step] = decide(NOW, r, listed, n, {}, {"local": T}, {}, frozenset({"r1"})).steps
    assert (step.move, step.terminate, step.count) == (S.TERMINATED, "m1", "released")


V = Verdict


def use(busy: int = 0, idle: float = 0.0, low: float | None = 0.0, up: float = 0.0,
        for_jobs: bool = True, draining: bool = False, leaving: bool = False) -> NodeUse:
    return NodeUse(8, busy, idle, low, up, for_jobs, draining, leaving)


@pytest.mark.parametrize("case, now, u, serves, expect", [
    ("idle for the timeout: drain", 30.0, use(), True, V.DRAIN),
    ("idle, young: keep", 29.0, use(), True, V.KEEP),
    ("under half busy for the timeout: drain (its jobs run on)", 30.0, use(busy=3), True,
     V.DRAIN),
    ("under half busy, young: keep", 29.0, use(busy=3), True, V.KEEP),
    ("half busy: keep", 30.0, use(busy=4, low=None), True, V.KEEP),
    ("its jobs are done, up for the timeout: drain", 30.0, use(busy=8, low=None), False,
     V.DRAIN),
    ("its jobs are done, up only 29 s: keep", 29.0, use(busy=8, low=None), False, V.KEEP),
    ("an operator's machine (launched for no job), busy: keep", 30.0,
     use(busy=8, low=None, for_jobs=False), False, V.KEEP),
    ("its jobs all move to spot: drain at once", 1.0, use(busy=8, low=None, leaving=True),
     True, V.DRAIN),
    ("draining with jobs: keep", 30.0, use(busy=2, draining=True), True, V.KEEP),
    ("draining, no job: release", 30.0, use(draining=True), True, V.RELEASE),
])
def test_the_scale_down_rule(case: str, now: float, u: NodeUse, serves: bool,
                             expect: Verdict) -> None:
    assert scale_down(now, u, 30.0, lambda: serves)[0] is expect, case


def test_production_drains_a_node_under_half_busy_and_one_whose_jobs_are_done() -> None:
    r = [Instance.from_dict({**rec("r1", S.READY, pid="m1", node="m1").to_dict(),
                             "for_jobs": ["j1"], "ready_at": 900.0})]
    n = [Node("m1", tuple(Gpu(f"g{i}", i, "A100-80GB", 80.0) for i in range(4)),
              site="local:home:home-a:ondemand", lease_expires=NOW + 100, instance_id="m1")]
    listed = {"local": {"m1": machine("m1", "r1")}}
    ids = frozenset({"r1"})
    first = decide(NOW, r, listed, n, {"m1": 1}, {"local": T}, {}, ids)
    assert first.steps == [] and first.low_since == {"m1": NOW}
    [low] = decide(NOW + 31, r, listed, n, {"m1": 1}, {"local": T}, {}, ids,
                   low_since=first.low_since).steps
    assert (low.move, low.drain, low.count) == (S.DRAINING, "m1", "scaled down")
    [done] = decide(NOW, r, listed, n, {"m1": 4}, {"local": T}, {}, ids,
                    serves=lambda rec: False).steps
    assert (done.drain, done.reason) == ("m1", "its jobs are done")
    assert decide(NOW, r, listed, n, {"m1": 4}, {"local": T}, {}, ids).steps == []
    [moving] = decide(NOW, r, listed, n, {"m1": 4}, {"local": T}, {}, ids,
                      leaving=lambda nid: nid == "m1").steps
    assert (moving.drain, moving.reason) == ("m1", "its jobs leave it (for spot or on-prem)")
