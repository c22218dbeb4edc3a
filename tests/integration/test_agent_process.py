"""The worker agent as a real process (``python -m workers``) on a Redis server of its own.

A private server (not a DB of the shared one): Celery queues and the cycle's control keys have
no prefix, so sharing a database with other tests would mix their commands with ours.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from broker.bus.runtime import Runtime
from broker.config.core import load_config
from broker.control.loop import apply_node_reports
from broker.model import Job, JobSpec, NodeState
from broker.model.state import JobState
from tests.conftest import private_redis
from tests.integration.harness import pid_alive, wait_until

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
FAST = {"SPILLWAY_HEARTBEAT_S": "0.3", "SPILLWAY_LEASE_TTL_S": "1.0", "SPILLWAY_GRACE_S": "2"}


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    """A redis-server of this module's own (tests/conftest.py private_redis)."""
    with private_redis() as url:
        yield url


@pytest.fixture
def rt(server: str) -> Iterator[Runtime]:
    """A Runtime on the private server, for submitting and running cycles in-process."""
    from broker.bus.app import app

    redis.Redis.from_url(server).flushdb()
    saved = app.conf.broker_url
    _drop_pools(app)
    runtime = Runtime(load_config(env={}), server)
    try:
        yield runtime
    finally:
        _drop_pools(app)
        app.conf.broker_url = saved


def _drop_pools(app: object) -> None:
    """Celery caches broker connections per app; rebuild them for the current URL."""
    app._pool = None  # type: ignore[attr-defined]
    app.amqp._producer_pool = None  # type: ignore[attr-defined]


class AgentProc:
    def __init__(self, url: str, node_id: str, work_dir: Path) -> None:
        self.url, self.node_id, self.work_dir = url, node_id, work_dir
        self.log = work_dir / f"agent-{node_id}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> subprocess.Popen[bytes]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("SPILLWAY_")}
        env.update(FAST, PYTHONUNBUFFERED="1", SPILLWAY_JOB_ISOLATION="false")
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "workers", "--redis-url", self.url, "--node-id",
                 self.node_id, "--gpus", "2xA100-80GB", "--work-dir", str(self.work_dir)],
                cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
        return self.proc

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


@pytest.fixture
def agent(server: str, tmp_path: Path) -> Iterator[AgentProc]:
    a = AgentProc(server, f"it-{uuid.uuid4().hex[:8]}", tmp_path)
    try:
        yield a
    finally:
        a.stop()
        print(f"----- agent log -----\n{a.output()[-4000:]}")
        from workers.procs import kill_leftovers

        assert kill_leftovers(a.node_id) == [], "job processes were left behind"


def registered(rt: Runtime, node_id: str, incarnation: str | None = None) -> bool:
    apply_node_reports(rt)  # (what a leading scheduler does before each cycle)
    return any(n.id == node_id and n.state is NodeState.READY and n.lease_expires > time.time()
               and n.incarnation != incarnation for n in rt.store.nodes())


def submit_and_place(rt: Runtime, node_id: str, command: str, gpus: int = 1) -> Job:
    from broker.control.loop import run_cycles

    job = rt.store.submit(JobSpec(command=command, gpus=gpus), time.time())
    assert run_cycles(rt) == 1
    placed = rt.store.get(job.id)
    assert placed.node_ids == (node_id,)
    return placed


def state_is(rt: Runtime, job: Job, *states: JobState) -> Job | None:
    apply_node_reports(rt)  # the agent's reports, as the leading scheduler applies them
    current = rt.store.get(job.id)
    return current if current.state in states else None


def lines(rt: Runtime, job: Job, attempt: int = 1) -> list[tuple[str, str]]:
    return [(x.stream, x.text) for x in rt.store.read_logs(job.id, attempt)]


def test_agent_runs_a_job_with_exactly_its_gpus(rt: Runtime, agent: AgentProc) -> None:
    agent.start()
    wait_until(lambda: registered(rt, agent.node_id), 30, "the agent to register")
    job = submit_and_place(rt, agent.node_id, "echo gpus=$CUDA_VISIBLE_DEVICES; echo oops >&2",
                           gpus=2)
    done = wait_until(lambda: state_is(rt, job, JobState.SUCCEEDED, JobState.FAILED), 30,
                      "the job to end")
    assert done.state is JobState.SUCCEEDED, done.history
    want = ",".join(job.allocations[0].gpu_ids)
    assert want == f"GPU-{agent.node_id}-0,GPU-{agent.node_id}-1"
    assert sorted(lines(rt, job)) == [("err", "oops"), ("out", f"gpus={want}")]
    local = (agent.work_dir / "logs" / f"{job.id}.1.log").read_text()
    assert f"out gpus={want}" in local
    assert rt.store.allocations([agent.node_id])[agent.node_id] == {}

    assert agent.proc is not None
    agent.proc.send_signal(signal.SIGTERM)
    assert agent.proc.wait(30) == 0


def test_sigterm_drains_the_node_and_requeues_its_jobs(rt: Runtime, agent: AgentProc) -> None:
    proc = agent.start()
    wait_until(lambda: registered(rt, agent.node_id), 30, "the agent to register")
    job = submit_and_place(rt, agent.node_id,
                           "trap 'echo checkpointing; exit 1' TERM; echo up; "
                           "while true; do sleep 0.05; done")
    wait_until(lambda: ("out", "up") in lines(rt, job), 30, "the job to run")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0
    apply_node_reports(rt)  # (its preemption and its part's end)
    after = rt.store.get(job.id)
    assert after.state is JobState.PENDING and after.attempt == 2, after.history
    assert [h.state for h in after.history][-2:] == [JobState.PREEMPTED, JobState.PENDING]
    assert ("out", "checkpointing") in lines(rt, job)
    (node,) = [n for n in rt.store.nodes() if n.id == agent.node_id]
    assert node.state is NodeState.DRAINING


def test_killed_agent_takes_its_job_with_it_and_a_restart_cleans_up(
        rt: Runtime, agent: AgentProc) -> None:
    proc = agent.start()
    wait_until(lambda: registered(rt, agent.node_id), 30, "the agent to register")
    (first,) = [n.incarnation for n in rt.store.nodes() if n.id == agent.node_id]
    # attempt 1: a background grandchild, then the main process waits; attempt 2 just ends
    job = submit_and_place(rt, agent.node_id,
                           'if [ "$SPILLWAY_ATTEMPT" = 1 ]; then sleep 300 & echo child=$!; '
                           'echo pid=$$; wait; fi; echo resumed=$SPILLWAY_RESUME')
    out = wait_until(lambda: dict(t.split("=") for s, t in lines(rt, job) if "=" in t)
                     if len(lines(rt, job)) >= 2 else None, 30, "the job's pids")
    main_pid, child_pid = int(out["pid"]), int(out["child"])
    assert pid_alive(main_pid) and pid_alive(child_pid)

    proc.kill()  # SIGKILL: no cleanup code runs in the agent
    proc.wait(10)
    wait_until(lambda: not pid_alive(main_pid), 10, "pdeathsig to kill the job's main process")
    # a grandchild has no parent-death signal: the agent's keeper kills it (its job cgroup,
    # or without cgroups its process group); a restart would kill what is still left
    wait_until(lambda: not pid_alive(child_pid), 10, "the keeper to kill the grandchild")
    wait_until(lambda: "keeper: agent gone; killed 1 job" in agent.output(), 10,
               "the keeper to log what it killed")

    agent.start()
    wait_until(lambda: registered(rt, agent.node_id, incarnation=first), 30,
               "the agent to register again")
    requeued = rt.store.get(job.id)
    assert requeued.attempt == 2 and requeued.state in (JobState.PENDING, JobState.STARTING,
                                                        JobState.RUNNING, JobState.SUCCEEDED)
    assert any(h.state is JobState.LOST for h in requeued.history)

    from broker.control.loop import run_cycles

    run_cycles(rt)
    done = wait_until(lambda: state_is(rt, job, JobState.SUCCEEDED, JobState.FAILED), 30,
                      "attempt 2 to end")
    assert done.state is JobState.SUCCEEDED and done.attempt == 2, done.history
    assert lines(rt, job, 2) == [("out", "resumed=1")]


def test_node_queue_is_consumed_without_acknowledgements(rt: Runtime, agent: AgentProc,
                                                         server: str) -> None:
    """The agent takes its commands with ``no_ack`` (workers/agent.py): kombu's "unacked" hash
    and index are never written, neither on delivery nor by an acknowledgement."""
    r = redis.Redis.from_url(server)
    r.config_set("notify-keyspace-events", "Kghz$")
    watch = r.pubsub()
    watch.subscribe("__keyspace@0__:unacked", "__keyspace@0__:unacked_index",
                    "__keyspace@0__:sentinel")
    try:
        agent.start()
        wait_until(lambda: registered(rt, agent.node_id), 30, "the agent to register")
        for _ in range(3):
            job = submit_and_place(rt, agent.node_id, "true")
            done = wait_until(lambda j=job: state_is(rt, j, JobState.SUCCEEDED,
                                                     JobState.FAILED), 30, "the job to end")
            assert done.state is JobState.SUCCEEDED, done.history
        r.set("sentinel", "1")  # its event comes after any earlier one
        seen: list[bytes] = []

        def sentinel_seen() -> bool:
            msg = watch.get_message(timeout=0.2)
            if msg is not None and msg["type"] == "message":
                seen.append(msg["channel"])
            return b"__keyspace@0__:sentinel" in seen

        wait_until(sentinel_seen, 10, "the sentinel's keyspace event")
        assert [c for c in seen if b"unacked" in c] == []
    finally:
        watch.close()
        r.config_set("notify-keyspace-events", "")
        r.close()


def test_a_lost_start_command_is_repaired(rt: Runtime, agent: AgentProc,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """What consuming without acknowledgements relies on: a start command that never reaches
    the agent (lost with a dying agent, or never sent) is not needed for the job to run. The
    agent reads its node's allocations at each heartbeat and starts what it should run (the
    reconciler also sends a start again once a job has stayed STARTING two heartbeats)."""
    from broker.bus import commands

    agent.start()
    wait_until(lambda: registered(rt, agent.node_id), 30, "the agent to register")
    send = commands.start_jobs
    monkeypatch.setattr(commands, "start_jobs", lambda celery, jobs: 0)  # the message is lost
    job = submit_and_place(rt, agent.node_id, "true")
    monkeypatch.setattr(commands, "start_jobs", send)
    assert rt.store.get(job.id).state is JobState.STARTING
    done = wait_until(lambda: state_is(rt, job, JobState.SUCCEEDED, JobState.FAILED), 30,
                      "the job to end")
    assert done.state is JobState.SUCCEEDED, done.history
