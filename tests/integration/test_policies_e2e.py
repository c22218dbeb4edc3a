"""The scheduling policies end to end: real Redis, a real scheduler process and real agent
processes running real subprocesses. Class preemption with a checkpoint and a resume, gangs
that start whole or not at all, MIG instances, EASY backfill in a reservation's shadow,
defragmentation moves, and relief for a short job starved by a long one.

Every cluster here runs the production default policy bundle, ``spillway`` (EASY backfill with
held reservations, fair share, the runtime predictor, class preemption), set explicitly through
``SPILLWAY_POLICY`` so that a change of default does not silently change what these tests
cover. Each test starts from an empty database, so the predictor has no history and falls back
to the jobs' time limits: the reservation arithmetic below is the limits' arithmetic.

Jobs that must stay running while the test looks at the queue wait for a release file that the
test creates, so no test depends on how long a job happens to take.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.client import Explanation
from broker.control.loop import STATS
from broker.model import Job
from broker.model.state import JobState
from tests.integration.harness import Cluster, wait_until, with_db
from tests.integration.test_end_to_end import assert_no_gpu_held_twice

pytestmark = pytest.mark.integration

DB = 10  # this module's own database on the session's Redis (Celery queues are unprefixed)
POLICY = "spillway"


@pytest.fixture
def cluster(redis_url: str, tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(with_db(redis_url, DB), tmp_path)
    # min_runtime_s: a job younger than this is never preempted (600 s by default)
    c.env.update({"SPILLWAY_POLICY": POLICY, "SPILLWAY_MIN_RUNTIME_S": "1"})
    try:
        yield c
    finally:
        for name in c.procs:
            print(f"----- {name} log tail -----\n{c.logs_of(name)[-3000:]}")
        c.stop()


def start_agent_with_inventory(cluster: Cluster, node_id: str, inventory: Path,
                               cpus: int = 64) -> None:
    """Like ``Cluster.start_agent``, with a YAML inventory file instead of ``--gpus``."""
    cluster._spawn(node_id, "worker", "--node-id", node_id, "--inventory", str(inventory),
                   "--cpus", str(cpus), "--work-dir", str(cluster.workdir / node_id))
    wait_until(lambda: any(n.id == node_id and n.state.value == "READY"
                           for n in cluster.store.nodes()), 30, f"agent {node_id} to register")


def wait_state(cluster: Cluster, job_id: str, state: JobState, timeout: float = 30) -> Job:
    def check() -> Job | None:
        job = cluster.client.get(job_id)
        return job if job.state is state else None

    found = wait_until(check, timeout, f"{job_id} to be {state.value}")
    assert found is not None
    return found


def wait_reason(cluster: Cluster, job_id: str, codes: set[str],
                timeout: float = 15) -> Explanation:
    """The job's explanation once its reason code is one of ``codes`` (still pending)."""
    def check() -> Explanation | None:
        why = cluster.client.explain(job_id)
        assert why.state is JobState.PENDING, (job_id, why.state, why.history)
        return why if why.reason_code in codes else None

    why = wait_until(check, timeout, f"{job_id} to be pending with a reason in {sorted(codes)}")
    assert why is not None
    return why


def span(job: Job, attempt: int = 1) -> tuple[float, float]:
    """When an attempt of a finished job started and ended (store times)."""
    att = job.attempts[attempt - 1]
    assert att.number == attempt and att.ended_at is not None, job.attempts
    return att.started_at, att.ended_at


def log_lines(cluster: Cluster, job_id: str, attempt: int | None = None) -> list[str]:
    return [ln.text for ln in cluster.client.logs(job_id, attempt=attempt)]


def gate(path: Path) -> str:
    """Shell: wait (bounded by the job's time limit) until the test creates ``path``."""
    return f'while [ ! -e "{path}" ]; do sleep 0.05; done'


# ---------------------------------------------------------------------------------------------
# 1. class preemption: SIGTERM, a checkpoint, a requeue, a resume


def test_critical_job_preempts_low_job_which_checkpoints_and_resumes(cluster: Cluster,
                                                                     tmp_path: Path) -> None:
    cluster.start_scheduler()
    cluster.start_agent("n1", "1xA100-80GB")
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    running = tmp_path / "low.running"
    record = tmp_path / "low.resumed"
    script = f"""
if [ "$SPILLWAY_RESUME" = 1 ]; then
    state=$(cat "$SPILLWAY_CHECKPOINT_DIR/state")
    echo "resumed attempt=$SPILLWAY_ATTEMPT state=$state"
    echo "attempt=$SPILLWAY_ATTEMPT resume=$SPILLWAY_RESUME state=$state" > "{record}"
    exit 0
fi
trap 'echo "step=42 attempt=$SPILLWAY_ATTEMPT" > "$SPILLWAY_CHECKPOINT_DIR/state"; \
echo checkpointed; exit 0' TERM
echo "first attempt=$SPILLWAY_ATTEMPT resume=${{SPILLWAY_RESUME:-unset}}"
touch "{running}"
while :; do sleep 0.1; done
"""
    low = cluster.client.submit(command=script, gpus=1, priority="low", name="low-ckpt",
                                checkpoint_dir=str(ckpt), time_limit="5m")
    wait_state(cluster, low.id, JobState.RUNNING)
    wait_until(running.exists, 10, "the low job's script to run")

    crit = cluster.client.submit(command='echo "critical on $CUDA_VISIBLE_DEVICES"; sleep 1',
                                 gpus=1, priority="critical", name="crit")
    crit_done = cluster.client.wait(crit.id, timeout=30)
    assert crit_done.state is JobState.SUCCEEDED, crit_done.history
    low_done = cluster.client.wait(low.id, timeout=30)
    assert low_done.state is JobState.SUCCEEDED, low_done.history

    # the low job: STOPPING (preemption) -> PREEMPTED -> PENDING attempt 2 -> ... -> SUCCEEDED
    states = [(h.state, h.attempt) for h in low_done.history]
    i = states.index((JobState.STOPPING, 1))
    assert states[i:i + 3] == [(JobState.STOPPING, 1), (JobState.PREEMPTED, 1),
                               (JobState.PENDING, 2)], low_done.history
    assert crit.id in low_done.history[i].reason, low_done.history[i]
    assert states[-1] == (JobState.SUCCEEDED, 2)
    assert low_done.attempt == 2
    assert [a.number for a in low_done.attempts] == [1, 2]
    # the preempted attempt ended before the critical job started, and the resumed one after
    # the critical job ended: one GPU, never two holders
    assert_no_gpu_held_twice([low_done, crit_done])
    assert span(low_done, 1)[1] <= span(crit_done)[0]
    assert span(crit_done)[1] <= span(low_done, 2)[0]

    # the first attempt checkpointed on SIGTERM; the second saw SPILLWAY_RESUME and the state
    assert record.read_text() == "attempt=2 resume=1 state=step=42 attempt=1\n"
    first = log_lines(cluster, low.id, attempt=1)  # (sh may also say its sleep "Terminated")
    assert first[0] == "first attempt=1 resume=unset" and first[-1] == "checkpointed", first
    assert log_lines(cluster, low.id, attempt=2) == ["resumed attempt=2 state=step=42 attempt=1"]
    assert not any(cluster.store.allocations().values())


# ---------------------------------------------------------------------------------------------
# 2. gangs: all ranks at once, or not at all


def test_gang_starts_whole_on_both_nodes_and_never_partially(cluster: Cluster,
                                                             tmp_path: Path) -> None:
    cluster.start_scheduler()
    cluster.start_agent("n1", "2xA100-80GB")
    cluster.start_agent("n2", "2xA100-80GB")
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    # each rank announces itself, then waits for the other: only a simultaneous start ends
    script = ('echo "rank=$SPILLWAY_NODE_RANK of $SPILLWAY_NUM_NODES on $SPILLWAY_NODE_ID '
              'gpus=$CUDA_VISIBLE_DEVICES"; '
              f'touch "{barrier}/$SPILLWAY_JOB_ID.$SPILLWAY_NODE_RANK"; '
              f'{gate(barrier / "$SPILLWAY_JOB_ID.$((1 - SPILLWAY_NODE_RANK))")}')
    gang = cluster.client.submit(command=script, gpus=2, nodes=2, name="gang", time_limit="30s")
    done = cluster.client.wait(gang.id, timeout=30)
    assert done.state is JobState.SUCCEEDED, done.history
    assert sorted(a.node_id for a in done.allocations) == ["n1", "n2"]
    lines = sorted(ln for ln in log_lines(cluster, gang.id) if ln.startswith("rank="))
    assert lines == sorted(f"rank={a.rank} of 2 on {a.node_id} gpus={','.join(a.gpu_ids)}"
                           for a in done.allocations)

    # a 1-GPU job holds one GPU of n1 (until released): a 2x2 gang must wait, whole
    release = tmp_path / "release"
    blocker = cluster.client.submit(command=gate(release), gpus=1, name="blocker",
                                    time_limit="1m")
    blocker_running = wait_state(cluster, blocker.id, JobState.RUNNING)
    held_node = blocker_running.allocations[0].node_id
    waiting = cluster.client.submit(command=script, gpus=2, nodes=2, name="gang-2",
                                    time_limit="30s")
    why = wait_reason(cluster, waiting.id, {"Resources", "Priority"})
    assert why.placement == ()
    assert "2 GPU(s)" in why.message and "2 nodes" in why.message, why.message
    # several more cycles (cycle_s 0.5) go by: it stays pending with nothing allocated
    stats_at = float(cluster.redis.hget(STATS, "at") or 0)
    wait_until(lambda: float(cluster.redis.hget(STATS, "at") or 0) > stats_at + 1.5,
               10, "three more scheduling cycles")
    still = cluster.client.get(waiting.id)
    assert still.state is JobState.PENDING and still.allocations == (), still.history
    assert cluster.client.get(blocker.id).state is JobState.RUNNING
    assert all(a.node_id == held_node for a in cluster.client.get(blocker.id).allocations)

    release.touch()
    blocker_done = cluster.client.wait(blocker.id, timeout=30)
    gang_done = cluster.client.wait(waiting.id, timeout=30)
    assert blocker_done.state is JobState.SUCCEEDED, blocker_done.history
    assert gang_done.state is JobState.SUCCEEDED, gang_done.history
    # one attempt, started after the blocker ended, on two nodes at once
    assert len(gang_done.attempts) == 1
    for job in (done, gang_done):
        for att in job.attempts:
            assert sorted(a.node_id for a in att.allocations) == ["n1", "n2"], att
            assert all(len(a.gpu_ids) == 2 for a in att.allocations), att
    blocker_end = span(blocker_done)[1]
    assert span(gang_done)[0] >= blocker_end
    starts = [h for h in gang_done.history if h.state is JobState.STARTING]
    assert len(starts) == 1 and starts[0].time >= blocker_end
    assert_no_gpu_held_twice([done, blocker_done, gang_done])
    assert not any(cluster.store.allocations().values())


# ---------------------------------------------------------------------------------------------
# 3. MIG: a job gets exactly its instance; whole-GPU jobs never land on a split GPU


def test_mig_jobs_get_their_instance_and_whole_gpu_jobs_the_whole_gpu(cluster: Cluster,
                                                                       tmp_path: Path) -> None:
    inventory = tmp_path / "n1.yaml"
    # GPU 0 is split into two 3g.40gb instances (MIG-n1-0-0, MIG-n1-0-1); GPU 1 is whole
    inventory.write_text("gpus:\n"
                         "  - {model: A100-80GB, mig: [3g.40gb, 3g.40gb]}\n"
                         "  - {model: A100-80GB, count: 1}\n")
    cluster.start_scheduler()
    start_agent_with_inventory(cluster, "n1", inventory)
    migs = {"MIG-n1-0-0", "MIG-n1-0-1"}

    # no two whole GPUs on n1: the split GPU does not count as one
    two = cluster.client.submit(command="true", gpus=2, name="two-whole",
                                hold_if_infeasible=True)  # (refused at submit otherwise)
    assert wait_reason(cluster, two.id, {"NoFeasibleNode"}).placement == ()
    cluster.client.cancel(two.id)

    barrier = tmp_path / "barrier"
    barrier.mkdir()
    say = 'echo "CVD=$CUDA_VISIBLE_DEVICES NVD=$NVIDIA_VISIBLE_DEVICES"'
    # both MIG jobs and the whole-GPU job must run at once for any of them to end
    names = ("mig-a", "mig-b", "whole")
    others = {n: [o for o in names if o != n] for n in names}

    def script(name: str) -> str:
        waits = "; ".join(gate(barrier / o) for o in others[name])
        return f'{say}; touch "{barrier / name}"; {waits}'

    mig_jobs = [cluster.client.submit(command=script(n), gpus=1, mig_profile="3g.40gb",
                                      name=n, time_limit="30s") for n in names[:2]]
    whole = cluster.client.submit(command=script("whole"), gpus=1, name="whole",
                                  time_limit="30s")
    done = [cluster.client.wait(j.id, timeout=30) for j in (*mig_jobs, whole)]
    assert [j.state for j in done] == [JobState.SUCCEEDED] * 3, [j.history for j in done]

    seen: list[str] = []
    for job in done:
        (alloc,) = job.allocations
        lines = [ln for ln in log_lines(cluster, job.id) if ln.startswith("CVD=")]
        assert lines == [f"CVD={alloc.gpu_ids[0]} NVD={alloc.gpu_ids[0]}"], (job.name, lines)
        assert len(alloc.gpu_ids) == 1
        seen.append(alloc.gpu_ids[0])
    assert set(seen[:2]) == migs  # one instance each, exactly its UUID
    assert seen[2] == "GPU-n1-1"  # the whole GPU, never the split GPU-n1-0
    assert_no_gpu_held_twice(done)

    # with both instances busy, a third MIG job waits; a whole-GPU job still never takes GPU 0
    release = tmp_path / "release"
    holders = [cluster.client.submit(command=f"{say}; {gate(release)}", gpus=1,
                                     mig_profile="3g.40gb", name=f"hold-{i}", time_limit="30s")
               for i in range(2)]
    for h in holders:
        wait_state(cluster, h.id, JobState.RUNNING)
    third = cluster.client.submit(command=say, gpus=1, mig_profile="3g.40gb", name="mig-c",
                                  time_limit="30s")
    whole2 = cluster.client.submit(command=say, gpus=1, name="whole-2", time_limit="30s")
    whole2_done = cluster.client.wait(whole2.id, timeout=30)
    assert whole2_done.allocations[0].gpu_ids == ("GPU-n1-1",)
    assert wait_reason(cluster, third.id, {"Resources", "Priority"}).placement == ()
    release.touch()
    third_done = cluster.client.wait(third.id, timeout=30)
    assert third_done.state is JobState.SUCCEEDED
    assert third_done.allocations[0].gpu_ids[0] in migs
    finished = [cluster.client.wait(h.id, timeout=30) for h in holders]
    assert_no_gpu_held_twice([*done, *finished, third_done, whole2_done])
    assert not any(cluster.store.allocations().values())


# ---------------------------------------------------------------------------------------------
# 4. EASY backfill: short jobs run in the reservation's shadow, long ones wait


def test_backfill_in_the_shadow_of_a_reservation(cluster: Cluster, tmp_path: Path) -> None:
    cluster.start_scheduler()
    cluster.start_agent("n1", "2xA100-80GB")
    release = tmp_path / "release-a"
    a = cluster.client.submit(command=gate(release), gpus=1, time_limit="60s", name="A")
    a_started = wait_state(cluster, a.id, JobState.RUNNING).started_at
    assert a_started is not None

    # B needs both GPUs: blocked, first in line, it holds the reservation for when A's
    # estimate (its 60 s limit: no history yet) runs out
    b = cluster.client.submit(command='echo "B on $CUDA_VISIBLE_DEVICES"; sleep 1', gpus=2,
                              time_limit="60s", name="B")
    why_b = wait_reason(cluster, b.id, {"Resources"})
    assert why_b.reservation is not None, why_b
    assert why_b.reservation["job_id"] == b.id
    assert why_b.reservation["node_ids"] == ["n1"]
    assert why_b.reservation["start_at"] == pytest.approx(a_started + 60, abs=1.0)

    # C (limit 20 s) ends before the reservation starts: it backfills at once
    c = cluster.client.submit(command="sleep 1", gpus=1, time_limit="20s", name="C")
    c_done = cluster.client.wait(c.id, timeout=15)
    assert c_done.state is JobState.SUCCEEDED, c_done.history
    assert cluster.client.get(b.id).state is JobState.PENDING
    assert cluster.client.get(a.id).state is JobState.RUNNING
    c_start = span(c_done)[0]
    assert c_start - c_done.submitted_at < 5

    # D (limit 1 h) would fit on the free GPU but would delay B: it waits
    d = cluster.client.submit(command="true", gpus=1, time_limit="1h", name="D")
    why_d = wait_reason(cluster, d.id, {"Reservation"})
    assert why_d.blocked_by is not None and why_d.blocked_by["job_id"] == b.id, why_d
    assert b.id in why_d.message
    # it keeps waiting over several cycles while B waits, with a GPU free all along
    stats_at = float(cluster.redis.hget(STATS, "at") or 0)
    wait_until(lambda: float(cluster.redis.hget(STATS, "at") or 0) > stats_at + 1.5,
               10, "three more scheduling cycles")
    assert cluster.client.get(d.id).state is JobState.PENDING
    assert cluster.client.get(b.id).state is JobState.PENDING
    assert cluster.client.explain(d.id).reason_code == "Reservation"

    release.touch()
    a_done, b_done, d_done = (cluster.client.wait(j.id, timeout=30) for j in (a, b, d))
    assert [j.state for j in (a_done, b_done, d_done)] == [JobState.SUCCEEDED] * 3
    a_end = span(a_done)[1]
    b_start, b_end = span(b_done)
    d_start = span(d_done)[0]
    assert c_start < a_end  # C ran in the shadow of B's reservation
    assert b_start >= a_end  # B started once A ended, long before its reservation time
    assert b_start < a_started + 60
    assert d_start >= b_start  # D only after B
    assert d_start >= b_end  # (and with 2 GPUs, only after B ended)
    assert_no_gpu_held_twice([a_done, b_done, c_done, d_done])
    assert time.time() - a_started < 60  # the whole story fit inside A's limit


# ---------------------------------------------------------------------------------------------
# 5. defragmentation: a small checkpointable job moves so that a wide one gets a whole node


def test_small_job_moves_to_make_a_whole_node_for_a_wide_one(cluster: Cluster,
                                                              tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    # a move must gain at least this long (600 s by default); the small jobs' 5 min limits
    # put the wide job's reservation minutes away
    config.write_text("policy_settings:\n  move:\n    defrag_min_gain_s: 5\n")
    cluster.env["SPILLWAY_CONFIG"] = str(config)
    cluster.start_scheduler()
    cluster.start_agent("n1", "2xA100-80GB")
    release = tmp_path / "release"

    def small(name: str) -> Job:
        ckpt = tmp_path / f"ckpt-{name}"
        ckpt.mkdir()
        script = f"""
if [ "$SPILLWAY_RESUME" = 1 ]; then
    echo "resumed on $SPILLWAY_NODE_ID from $(cat "$SPILLWAY_CHECKPOINT_DIR/state")"
    {gate(release)}
    exit 0
fi
trap 'echo "node=$SPILLWAY_NODE_ID" > "$SPILLWAY_CHECKPOINT_DIR/state"; echo checkpointed; \
exit 0' TERM
echo "first on $SPILLWAY_NODE_ID"
while [ ! -e "{release}" ]; do sleep 0.05; done
"""
        return cluster.client.submit(command=script, gpus=1, name=name, time_limit="5m",
                                     checkpoint_dir=str(ckpt))

    # one small job on each node: A and a filler on n1, then B on n2 once it joins
    a = small("A")
    wait_state(cluster, a.id, JobState.RUNNING)
    filler_gate = tmp_path / "filler"
    filler = cluster.client.submit(command=gate(filler_gate), gpus=1, name="filler",
                                   time_limit="5m")
    wait_state(cluster, filler.id, JobState.RUNNING)
    cluster.start_agent("n2", "2xA100-80GB")
    b = small("B")
    b_running = wait_state(cluster, b.id, JobState.RUNNING)
    assert b_running.allocations[0].node_id == "n2"
    filler_gate.touch()
    cluster.client.wait(filler.id, timeout=30)

    # two GPUs are free, one on each node: the wide job fits nowhere without a move
    w = cluster.client.submit(command='echo "W on $SPILLWAY_NODE_ID $CUDA_VISIBLE_DEVICES"',
                              gpus=2, name="W", time_limit="1m")
    w_done = cluster.client.wait(w.id, timeout=30)
    assert w_done.state is JobState.SUCCEEDED, w_done.history
    release.touch()
    a_done, b_done = (cluster.client.wait(j.id, timeout=30) for j in (a, b))
    assert [j.state for j in (a_done, b_done)] == [JobState.SUCCEEDED] * 2

    # one of them moved (whichever the victim order and the 1 s minimum runtime allowed):
    # SIGTERM with the reason, a checkpoint, attempt 2 on the other node
    moved, stayed = (a_done, b_done) if a_done.attempt == 2 else (b_done, a_done)
    assert (moved.attempt, stayed.attempt) == (2, 1), (a_done.history, b_done.history)
    states = [(h.state, h.attempt) for h in moved.history]
    i = states.index((JobState.STOPPING, 1))
    assert states[i:i + 3] == [(JobState.STOPPING, 1), (JobState.PREEMPTED, 1),
                               (JobState.PENDING, 2)], moved.history
    assert f"moved to make whole nodes for {w.id}" in moved.history[i].reason
    left = moved.attempts[0].allocations[0].node_id
    other = stayed.allocations[0].node_id
    assert left != other
    assert [x.node_id for x in moved.attempts[1].allocations] == [other]
    assert log_lines(cluster, moved.id, attempt=2) == [f"resumed on {other} from node={left}"]
    # W ran on the whole node the moved job left, after its first attempt ended
    assert [(x.node_id, len(x.gpu_ids)) for x in w_done.allocations] == [(left, 2)]
    assert span(moved, 1)[1] <= span(w_done)[0]
    assert_no_gpu_held_twice([a_done, b_done, w_done])
    assert not any(cluster.store.allocations().values())


# ---------------------------------------------------------------------------------------------
# 6. relief: a short job that would wait a day for a long one evicts it; the long one resumes


def test_short_job_starved_by_a_long_one_gets_relief(cluster: Cluster, tmp_path: Path) -> None:
    cluster.start_scheduler()
    cluster.start_agent("n1", "2xA100-80GB")
    release = tmp_path / "release"
    ckpt = tmp_path / "ckpt-L"
    ckpt.mkdir()
    script = f"""
if [ "$SPILLWAY_RESUME" = 1 ]; then
    echo "resumed from $(cat "$SPILLWAY_CHECKPOINT_DIR/state")"
    {gate(release)}
    exit 0
fi
trap 'echo "step=1" > "$SPILLWAY_CHECKPOINT_DIR/state"; echo checkpointed; exit 0' TERM
echo first
while [ ! -e "{release}" ]; do sleep 0.05; done
"""
    # a day-long, checkpointable job holds both GPUs
    long_job = cluster.client.submit(command=script, gpus=2, name="L", time_limit="24h",
                                     checkpoint_dir=str(ckpt))
    wait_state(cluster, long_job.id, JobState.RUNNING)
    # a one-minute job wanting both: EASY would reserve them for it in 24 h (a slowdown of
    # 1,440); relief evicts L, which loses a checkpoint and waits about a minute
    w = cluster.client.submit(command='echo "W on $CUDA_VISIBLE_DEVICES"', gpus=2, name="W",
                              time_limit="1m")
    w_done = cluster.client.wait(w.id, timeout=30)
    assert w_done.state is JobState.SUCCEEDED, w_done.history
    release.touch()
    l_done = cluster.client.wait(long_job.id, timeout=30)
    assert l_done.state is JobState.SUCCEEDED, l_done.history
    assert l_done.attempt == 2, l_done.history
    states = [(h.state, h.attempt) for h in l_done.history]
    i = states.index((JobState.STOPPING, 1))
    assert states[i:i + 3] == [(JobState.STOPPING, 1), (JobState.PREEMPTED, 1),
                               (JobState.PENDING, 2)], l_done.history
    assert l_done.history[i].reason.startswith(f"yielded to {w.id},")
    first = log_lines(cluster, l_done.id, attempt=1)  # (the shell may report the SIGTERM)
    assert (first[0], first[-1]) == ("first", "checkpointed"), first
    assert log_lines(cluster, l_done.id, attempt=2) == ["resumed from step=1"]
    # W ran between L's two attempts, on the GPUs L gave up
    assert span(l_done, 1)[1] <= span(w_done)[0] <= span(w_done)[1] <= span(l_done, 2)[0]
    assert_no_gpu_held_twice([l_done, w_done])
    assert not any(cluster.store.allocations().values())
