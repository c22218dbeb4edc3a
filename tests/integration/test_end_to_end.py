"""The on-prem broker end to end: real Redis, a real scheduler process (Celery worker with
beat) and real worker-agent processes with static inventories, running real subprocesses."""

from __future__ import annotations

import itertools
import os
import signal
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.errors import SpecError
from broker.model import Job
from broker.model.state import JobState
from tests.integration.harness import Cluster, pid_alive, wait_until, with_db

pytestmark = pytest.mark.integration

CLASSES = ("critical", "high", "normal", "low")


@pytest.fixture
def cluster(redis_url: str, tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(with_db(redis_url, 11), tmp_path)
    try:
        yield c
    except BaseException:
        raise
    finally:
        for name in c.procs:
            print(f"----- {name} log tail -----\n{c.logs_of(name)[-3000:]}")
        c.stop()


def _gpu_intervals(jobs: list[Job]) -> dict[tuple[str, str], list[tuple[float, float, str]]]:
    held: dict[tuple[str, str], list[tuple[float, float, str]]] = defaultdict(list)
    for job in jobs:
        for att in job.attempts:
            assert att.ended_at is not None, f"{job.id} attempt {att.number} never ended"
            for alloc in att.allocations:
                for gpu in alloc.gpu_ids:
                    held[(alloc.node_id, gpu)].append(
                        (att.started_at, att.ended_at, f"{job.id}#{att.number}"))
    return held


def assert_no_gpu_held_twice(jobs: list[Job]) -> None:
    for key, spans in _gpu_intervals(jobs).items():
        spans.sort()
        for (_s1, e1, who1), (s2, _e2, who2) in itertools.pairwise(spans):
            assert s2 >= e1, f"GPU {key} held by {who1} until {e1} and by {who2} from {s2}"


def test_fifty_jobs_four_classes_see_exactly_their_gpus(cluster: Cluster) -> None:
    cluster.start_scheduler()
    cluster.start_agent("n1", "4xA100-80GB")
    cluster.start_agent("n2", "4xH100-80GB")
    script = 'echo "CVD=$CUDA_VISIBLE_DEVICES ATTEMPT=$SPILLWAY_ATTEMPT"; sleep 0.3'
    jobs = [
        cluster.client.submit(command=script, gpus=(1, 2, 4, 1, 2)[i % 5],
                              priority=CLASSES[i % 4], team=f"team{i % 3}", name=f"e2e-{i}")
        for i in range(50)
    ]
    done = [cluster.client.wait(j.id, timeout=120) for j in jobs]
    assert [j.state for j in done] == [JobState.SUCCEEDED] * 50, [
        (j.id, j.state, j.history[-1].reason) for j in done if j.state is not JobState.SUCCEEDED]
    for job in done:
        lines = [ln.text for ln in cluster.client.logs(job.id)]
        visible = [ln for ln in lines if ln.startswith("CVD=")]
        assert len(visible) == 1, lines
        gpus = visible[0].split()[0].removeprefix("CVD=").split(",")
        assert gpus == list(job.allocations[0].gpu_ids)
        assert len(gpus) == job.spec.gpus
    assert_no_gpu_held_twice(done)
    # every GPU of both nodes was used, and the store holds no allocation any more
    assert all(not held for held in cluster.store.allocations().values())


def test_cancel_stops_the_whole_process_tree(cluster: Cluster, tmp_path: Path) -> None:
    cluster.start_scheduler()
    cluster.start_agent("n1", "2xA100-80GB")
    pids = tmp_path / "pids"
    script = f'sleep 300 & echo $! >> {pids}; sh -c "sleep 300" & echo $! >> {pids}; ' \
             f'echo $$ >> {pids}; wait'
    job = cluster.client.submit(command=script, gpus=1, name="tree")
    wait_until(lambda: pids.exists() and len(pids.read_text().split()) == 3, 30,
               "the job to start its children")
    tree = [int(p) for p in pids.read_text().split()]
    assert all(pid_alive(p) for p in tree)
    cluster.client.cancel(job.id)
    final = cluster.client.wait(job.id, timeout=30)
    assert final.state is JobState.CANCELLED
    wait_until(lambda: not any(pid_alive(p) for p in tree), 10, "every process of the job to die")
    assert not any(cluster.store.allocations().values())


def test_killed_agent_jobs_are_requeued_and_finish_elsewhere(cluster: Cluster,
                                                              tmp_path: Path) -> None:
    # the killed agent's node id is this test's own: its keeper kills every job cgroup of that
    # node id on the host, which would take the jobs of another test's agent with the same id
    # (pytest-xdist runs tests side by side)
    doomed = "n1-killed"
    cluster.start_scheduler()
    cluster.start_agent(doomed, "2xA100-80GB")
    marks = tmp_path / "marks"
    marks.mkdir()
    script = (f'echo $$ > {marks}/$SPILLWAY_JOB_ID.$SPILLWAY_ATTEMPT.$SPILLWAY_NODE_ID; '
              '[ "$SPILLWAY_ATTEMPT" = 1 ] && sleep 120; echo done')  # (still running at the kill)
    jobs = [cluster.client.submit(command=script, gpus=1, name=f"victim-{i}") for i in range(2)]
    wait_until(lambda: all(cluster.client.get(j.id).state is JobState.RUNNING for j in jobs),
               30, f"both jobs running on {doomed}")
    first_pids = wait_until(lambda: sorted(marks.glob(f"*.1.{doomed}")) if len(
        list(marks.glob(f"*.1.{doomed}"))) == 2 else None, 10, "pid marks")
    pids = [int(p.read_text()) for p in first_pids]
    cluster.start_agent("n2", "2xA100-80GB")
    killed_at = time.time()
    cluster.kill(doomed, signal.SIGKILL)
    # the dead agent's job processes die with it (parent-death signal)
    wait_until(lambda: not any(pid_alive(p) for p in pids), 10, "orphaned job processes to die")
    done = [cluster.client.wait(j.id, timeout=60) for j in jobs]
    for job in done:
        assert job.state is JobState.SUCCEEDED, job.history
        assert job.attempt == 2
        assert job.node_ids == ("n2",)
        # the loss is recorded after the kill, and the second attempt starts after the loss
        # (how soon is the lease's business, measured by the fault run, not asserted here)
        lost = next(i for i, h in enumerate(job.history) if h.state is JobState.LOST)
        assert job.history[lost].time >= killed_at - 1.0  # (the last heartbeat's lease)
        assert any(h.state is JobState.STARTING for h in job.history[lost + 1:]), job.history
        assert (marks / f"{job.id}.2.n2").exists()
    assert_no_gpu_held_twice(done)


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"command": "true", "gpus": -1}, "gpus"),
        ({"command": "true", "priority": "urgent"}, "priority"),
        ({"command": "true", "gpu_types": ["Z9000"]}, "gpu_types"),
        ({"command": ""}, "command"),
        ({"command": []}, "command"),
    ],
)
def test_bad_spec_is_refused_and_nothing_stored(cluster: Cluster, fields: dict[str, object],
                                                field: str) -> None:
    before = len(cluster.client.list())
    with pytest.raises(SpecError) as err:
        cluster.client.submit(**fields)
    assert [e.field for e in err.value.errors] == [field]
    assert field in str(err.value)
    assert len(cluster.client.list()) == before
    with pytest.raises(SpecError):
        cluster.client.submit_many([{"command": "true"}, fields])
    assert len(cluster.client.list()) == before


def test_restarted_agent_kills_leftovers(cluster: Cluster, tmp_path: Path) -> None:
    """A leftover job process from an earlier incarnation of a node is stopped on restart."""
    import subprocess

    env = {**os.environ, "SPILLWAY_NODE_ID": "n1", "SPILLWAY_JOB_ID": "j-old"}
    leftover = subprocess.Popen(["sleep", "300"], env=env, start_new_session=True)
    try:
        cluster.start_scheduler()  # (a node is taken, and shows READY, once a leader applies
        cluster.start_agent("n1", "1xA100-80GB")  # its registration)
        wait_until(lambda: leftover.poll() is not None, 10, "the leftover to be killed")
    finally:
        if leftover.poll() is None:
            leftover.kill()
        leftover.wait()


def test_gang_runs_on_all_its_nodes_at_once_and_fails_as_one(cluster: Cluster,
                                                             tmp_path: Path) -> None:
    cluster.start_scheduler()
    cluster.start_agent("n1", "2xA100-80GB")
    cluster.start_agent("n2", "2xA100-80GB")
    script = ('echo "rank=$SPILLWAY_NODE_RANK of $SPILLWAY_NUM_NODES on $SPILLWAY_NODE_ID '
              'gpus=$CUDA_VISIBLE_DEVICES"; sleep 0.5')
    gang = cluster.client.submit(command=script, gpus=2, nodes=2, name="gang")
    done = cluster.client.wait(gang.id, timeout=60)
    assert done.state is JobState.SUCCEEDED, done.history
    assert sorted(a.node_id for a in done.allocations) == ["n1", "n2"]
    lines = sorted(ln.text for ln in cluster.client.logs(gang.id) if ln.text.startswith("rank="))
    by_rank = {a.rank: a for a in done.allocations}
    assert lines == sorted(
        f"rank={r} of 2 on {a.node_id} gpus={','.join(a.gpu_ids)}" for r, a in by_rank.items())

    # rank 1 fails at once; rank 0 would run for minutes: it is stopped, the job FAILED
    marker = tmp_path / "rank0.pid"
    failing = cluster.client.submit(
        command=f'if [ "$SPILLWAY_NODE_RANK" = 1 ]; then exit 3; fi; echo $$ > {marker}; '
                'exec sleep 300', gpus=2, nodes=2, name="gang-fail")
    final = cluster.client.wait(failing.id, timeout=60)
    assert final.state is JobState.FAILED
    assert final.exit_code == 3
    assert any(h.reason.startswith("Part 1 failed") for h in final.history), final.history
    if marker.exists():
        wait_until(lambda: not pid_alive(int(marker.read_text())), 10, "rank 0 to be stopped")
    assert not any(cluster.store.allocations().values())


def test_time_limit_ends_the_job(cluster: Cluster) -> None:
    cluster.start_scheduler()
    cluster.start_agent("n1", "1xA100-80GB")
    job = cluster.client.submit(command="sleep 300", gpus=1, time_limit="2s", name="overrun")
    final = cluster.client.wait(job.id, timeout=30)
    assert final.state is JobState.FAILED
    assert "TimeLimit" in final.history[-1].reason
    ran = final.finished_at - next(h.time for h in final.history if h.state is JobState.RUNNING)
    assert 2.0 <= ran < 2.0 + 2.0 + 3.0  # limit, then SIGTERM and at most the grace period
