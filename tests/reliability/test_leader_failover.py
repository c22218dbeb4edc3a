"""The leading scheduler killed with SIGKILL, five times in a row, while jobs flow.

Two schedulers and two agents on a real Redis, 120 short jobs (a fifth submitted at each
round). Each round kills whichever scheduler leads at that moment (mid-cycle or between
cycles, as it falls) and starts a fresh one, so two always run (the next round waits for the
fresh one to reach Redis). Asserted: another scheduler leads within the lease and a fifth of
it (the design bound, 1.8 s with the defaults used here, under two cycle_s), every job
succeeds with exactly one attempt (nothing started twice, nothing lost), no GPU is held by two
jobs at once, and a killed scheduler leaves no process behind (it has none: no Celery worker,
no beat).

The takeover times are printed (``pytest -s``) for the notes.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import psutil
import pytest

from broker.model import Job, JobSpec
from broker.model.state import TERMINAL, JobState
from tests.integration.harness import Cluster, running, wait_until, with_db
from tests.integration.test_end_to_end import assert_no_gpu_held_twice

pytestmark = [pytest.mark.integration, pytest.mark.slow]

CYCLE_S, LEASE_S = 1.0, 1.5
KILLS = 5


@pytest.fixture
def cluster(redis_url: str, tmp_path: Path) -> Iterator[Cluster]:
    with running(with_db(redis_url, 10), tmp_path) as c:
        c.env.update({"SPILLWAY_CYCLE_S": str(CYCLE_S), "SPILLWAY_LEADER_LEASE_S": str(LEASE_S)})
        yield c


def leader_pid(cluster: Cluster) -> tuple[str, int] | None:
    held = cluster.store.leader(time.time())
    if held is None:
        return None
    token = held[0]
    return token, int(token.rsplit("-", 1)[1])  # "<epoch>:<host>-<pid>"


def _other_leader(cluster: Cluster, old: str) -> tuple[str, int] | None:
    now = leader_pid(cluster)
    return now if now is not None and now[0] != old else None


def _reaches_redis(cluster: Cluster, name: str) -> bool:
    """Has process ``name`` a connection to the cluster's Redis (started, not importing)?"""
    port = urlsplit(cluster.url).port
    try:
        conns = psutil.Process(cluster.procs[name].pid).net_connections(kind="tcp")
    except psutil.Error:
        return False
    return any(c.raddr and c.raddr.port == port and c.status == psutil.CONN_ESTABLISHED
               for c in conns)


def _all_finished(cluster: Cluster, ids: list[str]) -> list[Job] | None:
    finals = [cluster.client.get(i) for i in ids]
    return finals if all(j.state in TERMINAL for j in finals) else None


def test_the_leader_killed_five_times_loses_and_doubles_nothing(cluster: Cluster) -> None:
    cluster._spawn("sched-0", "scheduler")
    cluster._spawn("sched-1", "scheduler")
    cluster.start_agent("n1", "4xA100-80GB")
    cluster.start_agent("n2", "4xA100-80GB")
    for name in ("sched-0", "sched-1"):
        wait_until(lambda n=name: _reaches_redis(cluster, n), 60, f"{name} to reach Redis")
    jobs: list[Job] = []
    takeovers: list[float] = []
    spawned = 2
    for kill in range(KILLS):
        # kill the leader while jobs are flowing: 120 jobs in all, a fifth before each kill
        jobs += cluster.client.submit_many([JobSpec(command=["sleep", "0.4"], gpus=1,
                                                    name=f"f{kill * 24 + i}") for i in range(24)])
        wait_until(lambda: any(j.state is JobState.RUNNING for j in cluster.client.list()),
                   30, "jobs to run")
        token, pid = wait_until(lambda: leader_pid(cluster), 30, "a leader")
        name = next(n for n, p in cluster.procs.items() if p.pid == pid)
        assert psutil.Process(pid).children(recursive=True) == []  # nothing to leak
        t0 = time.monotonic()
        cluster.kill(name, signal.SIGKILL)
        new = wait_until(lambda old=token: _other_leader(cluster, old), 10,
                         "another scheduler to lead")
        takeovers.append(time.monotonic() - t0)
        assert new[1] != pid
        cluster._spawn(f"sched-{spawned}", "scheduler")  # two run again
        # the takeover measured is the lease's, from a standby already up: on a loaded machine
        # a new scheduler takes seconds to import, which the next kill must not wait out
        wait_until(lambda n=f"sched-{spawned}": _reaches_redis(cluster, n), 60,
                   f"sched-{spawned} to reach Redis")
        spawned += 1
    print(f"takeover after SIGKILL of the leader, s: {[round(t, 2) for t in takeovers]}")
    assert max(takeovers) <= LEASE_S * 1.2 + 0.5, takeovers  # the bound, with process slack
    done = wait_until(lambda: _all_finished(cluster, [j.id for j in jobs]), 120,
                      "every job to finish")
    assert [j.id for j in done if j.state is not JobState.SUCCEEDED] == []
    assert [j.id for j in done if j.attempt != 1 or len(j.attempts) != 1] == []  # no restart
    starts = [sum(1 for h in j.history if h.state is JobState.STARTING) for j in done]
    assert set(starts) == {1}  # nothing started twice
    assert_no_gpu_held_twice(done)
    killed = [p for p in cluster.procs.values() if p.poll() is not None]
    assert len(killed) == KILLS
    assert all(not psutil.pid_exists(p.pid) or psutil.Process(p.pid).status() == "zombie"
               for p in killed)


def test_reports_wait_for_a_scheduler_and_none_is_lost(cluster: Cluster) -> None:
    """Agents never write job records: their reports wait in their nodes' streams while no
    scheduler runs (killed here, with no standby), and the next one applies every one: jobs
    that ran and ended meanwhile succeed with one attempt each, their GPUs come back."""
    cluster._spawn("sched-0", "scheduler")
    cluster.start_agent("n1", "4xA100-80GB")
    jobs = cluster.client.submit_many([JobSpec(command=["sleep", "1"], gpus=1, name=f"w{i}")
                                       for i in range(4)])
    wait_until(lambda: all(cluster.client.get(j.id).state is JobState.RUNNING for j in jobs),
               60, "the jobs to run")
    cluster.kill("sched-0", signal.SIGKILL)
    # they end with no scheduler: starts and ends wait in n1's stream, the records stand
    wait_until(lambda: cluster.redis.xlen("sw:reports:n1") >= len(jobs), 30,
               "the agent's end reports to wait")
    assert all(cluster.client.get(j.id).state is JobState.RUNNING for j in jobs)
    cluster._spawn("sched-1", "scheduler")
    done = wait_until(lambda: _all_finished(cluster, [j.id for j in jobs]), 60,
                      "the new leader to apply them")
    assert [j.state for j in done] == [JobState.SUCCEEDED] * len(jobs)
    assert [j.attempt for j in done] == [1] * len(jobs)
    wait_until(lambda: cluster.redis.xlen("sw:reports:n1") == 0, 10, "the stream to drain")
    assert not any(cluster.store.allocations().values())
