"""An agent cut off and then back (a zombie): fencing refuses its stale reports.

The agent running a job is frozen with SIGSTOP (as a partition would cut it off) for longer
than its lease: the reconciler declares its node dead, the job is requeued (attempt 2) and
runs on the other node. The frozen agent is then let go (SIGCONT): its reports about attempt
1 are dropped by the scheduler that applies them (the attempt is stale), it stops that
attempt's process if it still runs (gone from its node's view), and the job's outcome is
recorded once, by attempt 2.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.model import JobSpec
from broker.model.state import JobState
from tests.integration.harness import Cluster, running, wait_until, with_db

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture
def cluster(redis_url: str, tmp_path: Path) -> Iterator[Cluster]:
    with running(with_db(redis_url, 9), tmp_path) as c:
        yield c


def test_a_zombie_agents_stale_reports_are_refused(cluster: Cluster, tmp_path: Path) -> None:
    marker, go = tmp_path / "ran", tmp_path / "go"
    cluster.start_scheduler()
    cluster.start_agent("n1", "2xA100-80GB")
    # each attempt's 3 s start once the agent is frozen (``go``), however long n2 takes to
    # start: attempt 1 must not finish before the cut (its deadline: 30 s)
    job = cluster.client.submit(JobSpec(
        command=f"echo $SPILLWAY_NODE_ID >> {marker}; "
                f"for _ in $(seq 600); do [ -e {go} ] && break; sleep 0.05; done; sleep 3",
        gpus=2, name="z"))
    wait_until(lambda: cluster.client.get(job.id).state is JobState.RUNNING, 30, "it to run")
    cluster.start_agent("n2", "2xA100-80GB")
    zombie = cluster.procs["n1"]
    zombie.send_signal(signal.SIGSTOP)  # cut off: no heartbeat, no reports
    go.touch()
    moved = wait_until(lambda: (j := cluster.client.get(job.id)).attempt == 2
                       and j.state is JobState.RUNNING and j, 30, "attempt 2 to run on n2")
    assert moved.allocations[0].node_id == "n2"
    zombie.send_signal(signal.SIGCONT)  # back: it still thinks it runs attempt 1
    done = wait_until(lambda: (j := cluster.client.get(job.id)).state is JobState.SUCCEEDED
                      and j, 60, "the job to finish")
    assert [(a.number, a.outcome) for a in done.attempts] == [(1, "LOST"), (2, "SUCCEEDED")]
    assert sum(1 for h in done.history if h.state is JobState.SUCCEEDED) == 1
    assert [h.attempt for h in done.history if h.state is JobState.RUNNING] == [1, 2]
    # the zombie came back: its reports on attempt 1 were dropped by the scheduler as stale
    # (it writes no job record), or it found attempt 1 gone from its node's view and killed it
    wait_until(lambda: ("a report of node n1 dropped" in cluster.logs_of("scheduler")
               and "stale" in cluster.logs_of("scheduler"))
               or "no longer runs here" in cluster.logs_of("n1"), 30,
               "the zombie's stale attempt to be refused")
    assert marker.read_text().split() == ["n1", "n2"]
