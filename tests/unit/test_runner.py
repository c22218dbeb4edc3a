"""The job runner (workers/runner.py) against a MemoryStore, with real child processes."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from broker.config.core import Config
from broker.cycle.plan import Plan, Start
from broker.model import Allocation, Gpu, Job, JobSpec, Node, NodeState
from broker.model.state import JobState
from broker.store.events import Exited
from broker.store.memory import MemoryStore
from workers.agent import Agent
from workers.procs import (
    LineSplitter,
    agent_tag,
    exit_code,
    find_leftovers,
    kill_leftovers,
)
from workers.runner import RunningPart, Supervisor

NODE = "n1"
GPUS = ("GPU-aaa", "GPU-bbb", "MIG-ccc")


def wait_for(pred: Callable[[], object], timeout: float = 10.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes whose process group is ``pgid``."""
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            stat = Path(f"/proc/{name}/stat").read_bytes()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2:].split()
        if int(fields[2]) == pgid and fields[0] != b"Z":
            out.append(int(name))
    return out


class Harness:
    def __init__(self, tmp: Path, grace_s: float = 5.0) -> None:
        self.store = MemoryStore()
        gpus = tuple(Gpu(g, i, "A100-80GB", 80.0) for i, g in enumerate(GPUS))
        self.store.heartbeat(Node(NODE, gpus, incarnation="i1"), 1e9, 0.0)
        self.exited: list[RunningPart] = []
        self._cond = threading.Condition()
        self.work_dir = tmp / "agent"
        self.sup = Supervisor(self.store, str(self.work_dir), on_exit=self._on_exit,
                              grace_s=grace_s)

    def _on_exit(self, part: RunningPart) -> None:
        with self._cond:
            self.exited.append(part)
            self._cond.notify_all()

    def place(self, gpu_ids: tuple[str, ...] = (), **spec: object) -> Job:
        """Submit a job and move it to STARTING on this node with ``gpu_ids``."""
        job = self.store.submit(JobSpec(gpus=len(gpu_ids), **spec), 0.0)  # type: ignore[arg-type]
        return self.restart(job, gpu_ids)

    def restart(self, job: Job, gpu_ids: tuple[str, ...]) -> Job:
        job = self.store.get(job.id)
        start = Start(job.id, job.attempt, job.version, (Allocation(NODE, gpu_ids),))
        assert self.store.apply(Plan(starts=(start,)), 1.0).started
        return self.store.get(job.id)

    def run(self, job: Job, gpu_ids: tuple[str, ...] = (), timeout: float = 10.0
            ) -> RunningPart:
        part = self.sup.spawn(job, 0, gpu_ids, NODE)
        assert part.start_error is None, part.start_error
        assert part.done.wait(timeout), "the job did not end"
        return part

    def lines(self, job: Job, stream: str | None = None) -> list[str]:
        logs = self.store.read_logs(job.id, job.attempt, limit=100_000)
        return [x.text for x in logs if stream is None or x.stream == stream]

    def env_of(self, job: Job) -> dict[str, str]:
        return dict(line.split("=", 1) for line in self.lines(job, "out") if "=" in line)


@pytest.fixture
def h(tmp_path: Path) -> Iterator[Harness]:
    harness = Harness(tmp_path)
    try:
        yield harness
    finally:
        harness.sup.close()


ENV_CMD = "env | grep -E '^(CUDA|NVIDIA|SPILLWAY)_'"


def test_env_has_exactly_the_jobs_gpus_and_spillway_vars(h: Harness) -> None:
    job = h.place(GPUS[:2], command=ENV_CMD, env={"CUDA_VISIBLE_DEVICES": "all", "FOO": "1"},
                  nodes=1)
    part = h.run(job, GPUS[:2])
    assert part.exit_code == 0 and part.reason == "Exited"
    env = h.env_of(job)
    assert env["CUDA_VISIBLE_DEVICES"] == "GPU-aaa,GPU-bbb"
    assert env["NVIDIA_VISIBLE_DEVICES"] == "GPU-aaa,GPU-bbb"
    assert env["SPILLWAY_JOB_ID"] == job.id
    assert env["SPILLWAY_ATTEMPT"] == "1"
    assert env["SPILLWAY_NODE_ID"] == NODE
    assert env["SPILLWAY_NODE_RANK"] == "0"
    assert env["SPILLWAY_NUM_NODES"] == "1"
    assert "SPILLWAY_RESUME" not in env
    ckpt = Path(env["SPILLWAY_CHECKPOINT_DIR"])
    assert ckpt.is_dir() and ckpt == h.work_dir / "checkpoints" / job.id


def test_no_gpus_means_an_empty_device_list(h: Harness) -> None:
    job = h.place((), command=ENV_CMD)
    h.run(job)
    assert h.env_of(job)["CUDA_VISIBLE_DEVICES"] == ""


def test_second_attempt_resumes_from_the_users_checkpoint_dir(h: Harness, tmp_path: Path
                                                              ) -> None:
    job = h.place((GPUS[2],), command=ENV_CMD, checkpoint_dir=str(tmp_path / "ck"))
    h.store.expire(2e9)  # the node's lease ran out: attempt 1 is lost, the job requeued
    h.store.heartbeat(Node(NODE, (Gpu(GPUS[2], 0, "A100-80GB", 80.0),), incarnation="i1"),
                      1e9, 3.0)
    job = h.restart(job, (GPUS[2],))
    assert job.attempt == 2
    h.run(job, (GPUS[2],))
    env = h.env_of(job)
    assert env["SPILLWAY_ATTEMPT"] == "2" and env["SPILLWAY_RESUME"] == "1"
    assert env["SPILLWAY_CHECKPOINT_DIR"] == str(tmp_path / "ck")
    assert env["CUDA_VISIBLE_DEVICES"] == "MIG-ccc"


def test_logs_are_captured_with_stream_labels_in_order(h: Harness) -> None:
    script = "for i in $(seq 1 1200); do echo out$i; done; echo oops >&2; printf 'no newline'"
    job = h.place((), command=script)
    part = h.run(job)
    assert part.exit_code == 0
    out = h.lines(job, "out")
    assert out == [f"out{i}" for i in range(1, 1201)] + ["no newline"]
    assert h.lines(job, "err") == ["oops"]
    local = (h.work_dir / "logs" / f"{job.id}.1.log").read_text().splitlines()
    assert local[0] == "out out1" and "err oops" in local and len(local) == 1202


@pytest.mark.parametrize(("command", "code", "reason"), [
    ("exit 3", 3, "Exited"),
    ("true", 0, "Exited"),
    ("kill -9 $$", 137, "Signal"),
])
def test_exit_codes(h: Harness, command: str, code: int, reason: str) -> None:
    part = h.run(h.place((), command=command))
    assert (part.exit_code, part.reason) == (code, reason)
    assert h.exited == [part]


def test_stop_sends_sigterm_then_sigkill_to_the_whole_process_tree(h: Harness) -> None:
    # The shell ignores SIGTERM and has a background grandchild: only SIGKILL ends them.
    job = h.place((), command="trap '' TERM; sleep 300 & echo started; wait; wait")
    part = h.sup.spawn(job, 0, (), NODE)
    wait_for(lambda: h.lines(job) == ["started"], what="the job's first line")
    assert len(group_members(part.pid)) == 2  # the shell and its sleep
    t0 = time.monotonic()
    assert h.sup.stop(job.id, job.attempt, grace_s=0.5)
    assert part.done.wait(10)
    assert time.monotonic() - t0 >= 0.45  # the grace period was given
    assert (part.exit_code, part.reason) == (137, "Stopped")
    wait_for(lambda: group_members(part.pid) == [], 5, "the group to be gone")


def test_stop_within_grace_keeps_the_jobs_own_exit_code(h: Harness) -> None:
    job = h.place((), command="trap 'echo checkpoint; exit 0' TERM; echo up; "
                              "while true; do sleep 0.05; done")
    part = h.sup.spawn(job, 0, (), NODE)
    wait_for(lambda: "up" in h.lines(job), what="the job to start")
    h.sup.stop(job.id, job.attempt, grace_s=30)
    assert part.done.wait(10)
    assert (part.exit_code, part.reason) == (0, "Stopped")
    assert "checkpoint" in h.lines(job)


def test_time_limit_terminates_with_a_nonzero_code(tmp_path: Path) -> None:
    h = Harness(tmp_path, grace_s=0.3)
    try:
        job = h.place((), command="sleep 300", time_limit=0.3)
        t0 = time.monotonic()
        part = h.run(job)
        assert time.monotonic() - t0 >= 0.25
        assert part.reason == "TimeLimit" and part.exit_code == 143
        graceful = h.place((), command="trap 'exit 0' TERM; while true; do sleep 0.05; done",
                           time_limit=0.3)
        part = h.run(graceful)
        assert part.reason == "TimeLimit" and part.exit_code != 0
    finally:
        h.sup.close()


def test_no_directory_to_run_in_is_reported_start_failed(h: Harness, tmp_path: Path) -> None:
    # a missing workdir runs in the job's own directory (test_workdir.py); none can be made here
    (h.work_dir / "jobs").write_text("not a directory")
    job = h.place((GPUS[0],), command="true", workdir=str(tmp_path / "missing"))
    part = h.sup.spawn(job, 0, (GPUS[0],), NODE)
    assert part.start_error is not None and "job's directory" in part.start_error
    assert part.pid is None and part.done.is_set()
    stored = h.store.get(job.id)
    assert stored.state is JobState.FAILED
    assert "job's directory" in stored.history[-1].reason
    assert h.store.allocations([NODE])[NODE] == {}  # its GPU is free again
    assert h.exited == []


def test_unknown_command_is_reported_start_failed(h: Harness) -> None:
    job = h.place((), command=["no-such-command-spillway"])
    part = h.sup.spawn(job, 0, (), NODE)
    assert part.start_error is not None and "no-such-command-spillway" in part.start_error
    assert h.store.get(job.id).state is JobState.FAILED


def test_stale_attempt_on_append_logs_kills_the_job(h: Harness) -> None:
    job = h.place((), command="while true; do echo tick; sleep 0.02; done")
    part = h.sup.spawn(job, 0, (), NODE)
    wait_for(lambda: "tick" in h.lines(job), what="the first log line")
    h.store.expire(2e9)  # node declared dead: attempt 1 is over, the job is requeued
    assert part.done.wait(10)
    assert part.reason == "StaleAttempt" and part.exit_code == 137
    wait_for(lambda: group_members(part.pid) == [], 5, "the group to be gone")


def test_close_kills_running_jobs(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    try:
        job = h.place((), command="sleep 300 & sleep 300")
        part = h.sup.spawn(job, 0, (), NODE)
        wait_for(lambda: len(group_members(part.pid)) >= 2, what="the shell and its sleeps")
    finally:
        h.sup.close()
    assert part.done.is_set() and part.reason == "AgentStopped"
    wait_for(lambda: group_members(part.pid) == [], 5, "the group to be gone")


def test_many_short_jobs(h: Harness) -> None:
    jobs = [h.place((), command=["true"]) for _ in range(100)]
    parts = h.sup.spawn_many([(j, 0, ()) for j in jobs], NODE)
    assert h.sup.wait_idle(30)
    assert all(p.exit_code == 0 and p.done.is_set() for p in parts)
    assert len(h.exited) == 100


def test_leftover_scan_finds_processes_with_the_node_id(tmp_path: Path) -> None:
    node_id = f"leftover-{uuid.uuid4().hex[:8]}"
    env = {**os.environ, "SPILLWAY_NODE_ID": node_id}
    other = {**os.environ, "SPILLWAY_NODE_ID": node_id + "-other"}
    proc = subprocess.Popen(["sleep", "300"], env=env, start_new_session=True)
    bystander = subprocess.Popen(["sleep", "300"], env=other, start_new_session=True)
    try:
        wait_for(lambda: proc.pid in find_leftovers(node_id), what="the scan to see it")
        assert find_leftovers(node_id, exclude=[proc.pid]) == []
        assert bystander.pid not in find_leftovers(node_id)
        killed = kill_leftovers(node_id)
        assert [pid for pid, _ in killed] == [proc.pid]
        assert "sleep 300" in killed[0][1]
        assert proc.wait(10) == -signal.SIGKILL
        assert bystander.poll() is None
    finally:
        for p in (proc, bystander):
            p.kill()
            p.wait()


def test_leftover_scan_spares_jobs_of_a_live_agent(tmp_path: Path) -> None:
    node_id = f"leftover-{uuid.uuid4().hex[:8]}"
    live_agent = subprocess.Popen(["sleep", "300"])  # stands in for another live agent
    procs = {}
    try:
        tags = {"live": agent_tag(live_agent.pid), "dead": "999999999:0", "self": agent_tag()}
        for name, tag in tags.items():
            env = {**os.environ, "SPILLWAY_NODE_ID": node_id, "SPILLWAY_AGENT": tag}
            procs[name] = subprocess.Popen(["sleep", "300"], env=env, start_new_session=True)
        wait_for(lambda: procs["dead"].pid in find_leftovers(node_id), what="the scan")
        assert find_leftovers(node_id) == [procs["dead"].pid]
    finally:
        for p in (live_agent, *procs.values()):
            p.kill()
            p.wait()


def test_jobs_carry_their_agents_tag(h: Harness) -> None:
    job = h.place((), command="echo $SPILLWAY_AGENT")
    h.run(job)
    assert h.lines(job) == [agent_tag()]


def test_line_splitter_and_exit_codes() -> None:
    s = LineSplitter()
    assert s.feed(b"a\r\nb") == ["a"]
    assert s.feed(b"c\n\xff\n") == ["bc", "\ufffd"]
    assert s.feed(b"x" * (70 * 1024)) == ["x" * (64 * 1024)]
    assert s.close() == ["x" * (6 * 1024)]
    assert exit_code(-9) == 137 and exit_code(0) == 0 and exit_code(2) == 2


@pytest.mark.skipif(sys.platform != "linux", reason="pidfd and /proc are Linux-only")
def test_a_burst_of_spawns_all_start_and_exit(h: Harness) -> None:
    """200 jobs handed over at once all start and end (speed is `spillway bench dispatch`'s
    business, not a timed assertion here)."""
    jobs = [h.place((), command=["true"]) for _ in range(200)]
    parts = h.sup.spawn_many([(j, 0, ()) for j in jobs], NODE)
    assert h.sup.wait_idle(60)
    assert [p.start_error for p in parts] == [None] * len(jobs)
    assert all(p.done.is_set() and p.exit_code == 0 and p.reason == "Exited" for p in parts)


def test_a_batch_forked_at_once_keeps_its_order_and_fails_only_the_part_that_cannot_start(
        h: Harness) -> None:
    """A batch's processes are forked by several threads at once: each part gets its own
    process and outcome, in the batch's order; a part whose process cannot be made (here a NUL
    byte in its argv) fails alone (StartFailed), and the others run."""
    jobs = [h.place((), command=c) for c in (["echo", "a"], ["echo", "b"], ["echo", "c"],
                                               ["echo", "d"])]
    # (submit refuses a NUL: the record of an older client holds one)
    jobs[1] = replace(jobs[1], spec=jobs[1].spec.model_copy(
        update={"command": ["echo", "b\x00"]}))
    parts = h.sup.spawn_many([(j, 0, ()) for j in jobs], NODE)
    assert [p.job_id for p in parts] == [j.id for j in jobs]
    assert parts[1].start_error is not None and "null byte" in parts[1].start_error
    assert h.store.get(jobs[1].id).state is JobState.FAILED
    assert h.sup.wait_idle(30)
    ok = [parts[i] for i in (0, 2, 3)]
    assert all(p.start_error is None and p.exit_code == 0 for p in ok)
    assert len({p.pid for p in ok}) == 3
    assert [h.lines(jobs[i], "out") for i in (0, 2, 3)] == [["a"], ["c"], ["d"]]


# -- the agent's decisions (workers/agent.py) against the same store ---------------------------


class AgentHarness(Harness):
    """A Harness whose supervisor belongs to an Agent (no Celery, no heartbeat thread)."""

    def __init__(self, tmp: Path) -> None:
        super().__init__(tmp)
        self.sup.close()
        self.triggers = 0
        self.stops: list[Job] = []
        node = self.store.nodes()[0]
        self.agent = Agent(self.store, Config(grace_s=5.0, job_isolation=False), node,
                           str(self.work_dir),
                           trigger=self._trigger, send_stops=self.stops.append)
        self.sup = self.agent.sup

    def _trigger(self) -> None:
        self.triggers += 1

    def state(self, job: Job) -> JobState:
        return self.store.get(job.id).state

    def wait_state(self, job: Job, *states: JobState) -> Job:
        wait_for(lambda: self.state(job) in states, what=f"{job.id} in {states}")
        return self.store.get(job.id)


@pytest.fixture
def a(tmp_path: Path) -> Iterator[AgentHarness]:
    harness = AgentHarness(tmp_path)
    try:
        yield harness
    finally:
        harness.agent.close()


def test_agent_starts_a_job_once_and_reports_its_end(a: AgentHarness) -> None:
    job = a.place(GPUS[:1], command="echo hi; sleep 0.2")
    a.agent.start_jobs([(job.id, 1)])
    assert a.state(job) is JobState.RUNNING
    a.agent.start_jobs([(job.id, 1)])  # a redelivered message
    a.agent.start_jobs([(job.id, 2)])  # an attempt that does not exist
    done = a.wait_state(job, JobState.SUCCEEDED)
    assert len(a.exited) == 0 and a.lines(job) == ["hi"]  # the agent owns on_exit
    assert done.history[-1].reason == "Exited 0" and a.triggers >= 1
    a.agent.start_jobs([(job.id, 1)])  # a late copy after the end starts nothing
    assert a.sup.parts() == [] and a.store.allocations([NODE])[NODE] == {}


def test_agent_reconcile_starts_a_job_whose_message_was_lost(a: AgentHarness) -> None:
    job = a.place(GPUS[1:2], command=ENV_CMD)
    a.agent.reconcile()
    a.wait_state(job, JobState.SUCCEEDED)
    assert a.env_of(job)["CUDA_VISIBLE_DEVICES"] == GPUS[1]


def test_agent_reconcile_kills_a_part_whose_attempt_is_over(a: AgentHarness) -> None:
    job = a.place(GPUS[:1], command="sleep 300")
    a.agent.start_jobs([(job.id, 1)])
    (part,) = a.sup.parts()
    a.store.expire(2e9)  # the node was declared dead meanwhile: the job is requeued
    assert a.store.get(job.id).state is JobState.PENDING
    a.agent.reconcile()
    assert part.done.wait(10) and part.reason == "NotAllocated"
    wait_for(lambda: group_members(part.pid) == [], 5, "the group to be gone")


def test_agent_reconcile_stops_a_cancelled_job_without_a_stop_message(a: AgentHarness) -> None:
    job = a.place(GPUS[:1], command="sleep 300")
    a.agent.start_jobs([(job.id, 1)])
    a.store.cancel(job.id, 5.0)
    a.agent.reconcile()
    done = a.wait_state(job, JobState.CANCELLED)
    assert done.exit_code == 143


def test_agent_stop_of_a_job_that_never_started(a: AgentHarness) -> None:
    job = a.place(GPUS[:1], command="sleep 300")
    a.store.cancel(job.id, 5.0)
    a.agent.stop_job(job.id, 1, 5.0)
    assert a.state(job) is JobState.CANCELLED
    assert a.sup.parts() == []
    a.agent.start_jobs([(job.id, 1)])  # the start message, arriving late
    assert a.sup.parts() == []


def test_agent_gang_part_failure_stops_the_other_parts(a: AgentHarness) -> None:
    other = Node("n2", (Gpu("GPU-n2", 0, "A100-80GB", 80.0),), incarnation="x")
    a.store.heartbeat(other, 1e9, 0.0)
    job = a.store.submit(JobSpec(command="exit 3", gpus=1, nodes=2), 0.0)
    start = Start(job.id, 1, job.version, (Allocation(NODE, GPUS[:1], 0),
                                           Allocation("n2", ("GPU-n2",), 1)))
    a.store.apply(Plan(starts=(start,)), 1.0)
    a.agent.start_jobs([(job.id, 1)])
    wait_for(lambda: a.stops, what="a stop for the gang's other part")
    assert a.stops[0].state is JobState.STOPPING and a.stops[0].stop_target is JobState.FAILED
    a.store.report(job.id, 1, Exited(1, 143, "Stopped"), 9.0)
    assert a.state(job) is JobState.FAILED


def test_agent_drain_preempts_running_and_unstarted_jobs(a: AgentHarness) -> None:
    running = a.place(GPUS[:1], command="trap 'echo saving; exit 1' TERM; echo up; "
                                       "while true; do sleep 0.05; done")
    unstarted = a.place(GPUS[1:2], command="sleep 300")
    a.agent.start_jobs([(running.id, 1)])
    wait_for(lambda: "up" in a.lines(running), what="the job to start")
    assert a.agent.drain(timeout=10)
    for job in (running, unstarted):
        after = a.store.get(job.id)
        assert after.state is JobState.PENDING and after.attempt == 2, after.history
        assert any(h.state is JobState.PREEMPTED for h in after.history)
    assert "saving" in a.store.read_logs(running.id, 1)[-1].text
    assert a.store.nodes()[0].state is NodeState.DRAINING
    a.agent.start_jobs([(running.id, 2)])  # nothing new starts while draining
    assert a.sup.parts() == []


def test_agent_reports_a_start_again_when_the_first_report_failed(a: AgentHarness) -> None:
    job = a.place(GPUS[:1], command="sleep 300")
    real_report, calls = a.store.report_many, []

    def flaky(*args: object, **kw: object) -> list[Job | Exception]:
        calls.append(args)
        if len(calls) == 1:
            raise ConnectionError("store unreachable")
        return real_report(*args, **kw)  # type: ignore[arg-type]

    a.store.report_many = flaky  # type: ignore[method-assign]
    a.agent.start_jobs([(job.id, 1)])
    assert a.state(job) is JobState.STARTING and len(a.sup.parts()) == 1
    a.agent.reconcile()  # neither starts it twice nor leaves it STARTING
    assert a.state(job) is JobState.RUNNING and len(a.sup.parts()) == 1


@pytest.mark.parametrize(("command", "writes", "folded"), [
    ("true", 1, True),  # ended quietly before its start was reported: one write
    ("echo hi", 2, False),  # its line is stored first: the end is a write of its own
    ("exit 3", 1, True),  # a failure folds the same way
])
def test_agent_reports_a_quick_quiet_part_s_start_and_end_in_one_write(
        a: AgentHarness, command: str, writes: int, folded: bool) -> None:
    """A part that ended before its start was reported, without a line of output, has its
    cgroup and scratch released by the agent's thread and its start and end written
    together; the reporter thread then neither releases it again nor reports its end."""
    job = a.place(GPUS[:1], command=command)
    real_report, calls = a.store.report_many, []

    def counted(reports: list, *args: object, **kw: object) -> list[Job | Exception]:
        calls.append([type(r[2]).__name__ for r in reports])
        return real_report(reports, *args, **kw)  # type: ignore[arg-type]

    real_started = a.agent._report_started

    def after_the_exit(parts: list[RunningPart]) -> None:
        # the start report waits until the supervisor has seen the exit: the quick job
        wait_for(lambda: all(p.exit_code is not None for p in parts), what="the exit")
        real_started(parts)

    a.store.report_many = counted  # type: ignore[method-assign]
    a.agent._report_started = after_the_exit  # type: ignore[method-assign]
    a.agent.start_jobs([(job.id, 1)])
    done = a.wait_state(job, JobState.SUCCEEDED, JobState.FAILED)
    assert a.sup.wait_idle(10)
    assert len(calls) == writes, calls
    assert (calls[0] == ["Started", "Exited"]) is folded
    assert [h.state for h in done.history][-2:] == [
        JobState.RUNNING, JobState.SUCCEEDED if command != "exit 3" else JobState.FAILED]
    iso = a.agent.isolation
    assert not os.listdir(iso.scratch_root)  # released, by one of the two threads
    assert not any(os.path.isdir(os.path.join(d, n)) for d in iso.node_dirs
                   for n in os.listdir(d))


def test_a_job_box_is_released_once_whichever_thread_comes_first(tmp_path: Path) -> None:
    from workers.detection import detect

    iso = detect(f"rel-{uuid.uuid4().hex[:8]}", str(tmp_path / "iso"), warn=False)
    box = iso.box("j", 1, 0, memory_gb=0, cpus=0)
    removed: list[str] = []
    real_rmdir = os.rmdir

    def rmdir(path: str) -> None:
        removed.append(path)
        real_rmdir(path)

    gate = threading.Barrier(4)

    def release() -> None:
        gate.wait()
        box.release()

    os.rmdir = rmdir  # type: ignore[assignment]
    try:
        threads = [threading.Thread(target=release) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
    finally:
        os.rmdir = real_rmdir  # type: ignore[assignment]
    assert box.released
    assert removed.count(box.scratch) == 1 and not os.path.exists(box.scratch)
    for d in box.dirs:  # (none where this host has no cgroups)
        assert removed.count(d) == 1 and not os.path.exists(d)
    for d in iso.node_dirs:
        os.rmdir(d)


# -- jobs as an unprivileged user (job_user) -----------------------------------------------------


@pytest.mark.skipif(os.geteuid() != 0, reason="only root can run jobs as another user")
@pytest.mark.parametrize("isolated", [False, True])
def test_jobs_run_as_the_configured_user(tmp_path: Path, isolated: bool) -> None:
    import pwd

    from workers.detection import detect

    nobody = pwd.getpwnam("nobody")
    top = tempfile.mkdtemp(prefix="spillway-user-")  # (pytest's tmp_path is 0700: no way in)
    os.chmod(top, 0o711)
    tmp_path = Path(top)
    h = Harness(tmp_path)
    h.sup.close()
    iso = detect("user-test", str(tmp_path / "iso"), warn=False) if isolated else None
    h.sup = Supervisor(h.store, str(h.work_dir), on_exit=h._on_exit, isolation=iso,
                       job_user="nobody")
    try:
        job = h.place(command="id -u; id -g; test -w \"$TMPDIR\" && echo scratch-ok; true",
                      workdir="/tmp")
        part = h.run(job)
        assert part.exit_code == 0, h.lines(job)
        out = h.lines(job, "out")
        assert out[:2] == [str(nobody.pw_uid), str(nobody.pw_gid)]
        assert ("scratch-ok" in out) is isolated  # its scratch directory is its own
    finally:
        h.sup.close()
        shutil.rmtree(top, ignore_errors=True)


def test_an_unknown_job_user_is_refused_by_name(tmp_path: Path) -> None:
    from broker.errors import ConfigError

    with pytest.raises(ConfigError, match="job_user: 'no-such-user-x' is no user on this"):
        Supervisor(MemoryStore(), str(tmp_path), job_user="no-such-user-x")
