"""A cloud machine rented for jobs serves them first (policies/burst/offers.py ``booting_bins`` and
``take_booting``, policies/place/queue.py ``own_machines_first``).

Before, a machine launched for a job went to whichever job came first in the queue: while it
booted, a job ahead counted on it (the job it was launched for rented again, every cycle),
and once up the queue walk placed the job ahead there. In the busiest 2 days at 110% of
seed-160-burst, seed 2, one normal job rented five machines in six minutes, each taken by a
job ahead of it, until its SLA was lost (and 346 of the run's 592 machines served only jobs
they were not launched for). A gang's machines were not counted at all while they booted: it
rented again at every cycle.

The cluster: node ``a`` with 4 A100s held by ``r`` (long); offers boot in 60 s. Job ``x`` is
ahead of ``p`` in the queue (submitted earlier, same class), and both are past their decision
time: either would rent now.
"""

from __future__ import annotations

from typing import Any

import pytest

from broker.cycle.plan import Plan
from broker.model import Instance, InstanceState, Job
from tests.builders import node
from tests.unit.test_burst import OD, SPOT, cycle, late, launched, offer
from tests.unit.test_preemption import NOW

CLOUD_SITE = "aws:us-east-1:us-east-1a:spot"


def booting(rid: str, jobs: tuple[str, ...], offer_id: str = SPOT.id) -> Instance:
    return Instance(rid, offer_id, InstanceState.BOOTING, requested_at=NOW - 10,
                    provider_id=rid, for_jobs=jobs)


def up(rid: str, jobs: tuple[str, ...], node_id: str, offer_id: str = SPOT.id) -> Instance:
    return Instance(rid, offer_id, InstanceState.READY, requested_at=NOW - 100,
                    provider_id=rid, node_id=node_id, for_jobs=jobs)


X, P = late("x", left=100), late("p", left=150)  # x is ahead of p
GANG = late("p", left=150, nodes=2)
SPOT2 = offer("spot", gpus=2)
OFFERS = (SPOT, OD, SPOT2)


def waits_for(plan: Plan, job_id: str) -> str:
    """The instance a job waits for ('' when it does not wait for one)."""
    msg = plan.pending[job_id].message if job_id in plan.pending else ""
    return msg.split("waiting for cloud instance ")[1].split()[0] if "waiting for" in msg \
        else ""


# (queue, instances, launches [(offer id, count, jobs)], job -> the instance it waits for)
BOOTING: dict[str, tuple[list[Job], tuple[Instance, ...], list[Any], dict[str, str]]] = {
    "the machine launched for p waits for p; x ahead of it rents its own": (
        [X, P], (booting("m1", ("p",)),), [(SPOT.id, 1, ("x",))], {"p": "m1", "x": ""}),
    "a machine launched for nobody still waiting is taken in queue order": (
        [X, P], (booting("m1", ("q",)),), [(SPOT.id, 1, ("p",))], {"x": "m1", "p": ""}),
    "room p leaves on its machine goes to the job ahead": (
        [X, P], (booting("m1", ("p",), SPOT2.id),), [],
        {"p": "m1", "x": "m1"}),
    "p holds one of the two machines launched for it; x takes the other": (
        [X, P], (booting("m1", ("p",)), booting("m2", ("p",))), [], {"p": "m1", "x": "m2"}),
    "a gang waits for its own machines instead of renting again": (
        [GANG], (booting("g1", ("p",)), booting("g2", ("p",))), [], {"p": "g1"}),
    "a gang's machines are held for it: x rents its own": (
        [X, GANG], (booting("g1", ("p",)), booting("g2", ("p",))), [(SPOT.id, 1, ("x",))],
        {"p": "g1", "x": ""}),
}


@pytest.mark.parametrize(("queue", "instances", "want", "waits"), list(BOOTING.values()),
                         ids=list(BOOTING))
def test_booting_machines_are_held_for_their_jobs(
        queue: list[Job], instances: tuple[Instance, ...], want: list[Any],
        waits: dict[str, str]) -> None:
    plan = cycle(queue, OFFERS, instances=instances)
    assert launched(plan) == want
    for job_id, rid in waits.items():
        assert waits_for(plan, job_id) == rid, plan.pending.get(job_id)


NODES = [node("a", 4), node("c", 1, "V100-16GB", site=CLOUD_SITE),
         node("d", 1, "V100-16GB", site=CLOUD_SITE)]


# (queue, instances, nodes beyond ``a``, job -> the nodes it starts on)
UP: dict[str, tuple[list[Job], tuple[Instance, ...], int, dict[str, tuple[str, ...]]]] = {
    "the machine up starts p, who it was rented for, not x ahead of it": (
        [X, P], (up("m1", ("p",), "c"),), 1, {"p": ("c",)}),
    "a machine whose job is no longer waiting serves the queue": (
        [X], (up("m1", ("p",), "c"),), 1, {"x": ("c",)}),
    "an operator's machine (launched for nobody) serves the queue": (
        [X, P], (up("m1", (), "c"),), 1, {"x": ("c",)}),
    "a gang with a machine still booting keeps the one up: nobody starts": (
        [X, late("p", left=150, nodes=2)], (up("g1", ("p",), "c"), booting("g2", ("p",))), 2,
        {"x": ("d",)}),
    "a gang whose machines are all up starts on them": (
        [X, late("p", left=150, nodes=2)], (up("g1", ("p",), "c"), up("g2", ("p",), "d")), 2,
        {"p": ("c", "d")}),
}


@pytest.mark.parametrize(("queue", "instances", "extra", "starts"), list(UP.values()),
                         ids=list(UP))
def test_a_machine_up_serves_its_own_jobs_first(
        queue: list[Job], instances: tuple[Instance, ...], extra: int,
        starts: dict[str, tuple[str, ...]]) -> None:
    plan = cycle(queue, instances=instances, nodes=NODES[:1 + extra])
    assert {s.job_id: tuple(a.node_id for a in s.allocations) for s in plan.starts} == starts


def test_without_instances_the_queue_is_walked_as_before() -> None:
    """No instance, no change: x ahead takes the one cloud node (the node of an operator's
    machine the snapshot does not list)."""
    plan = cycle([X, P], nodes=NODES[:2])
    assert [s.job_id for s in plan.starts] == ["x"]
