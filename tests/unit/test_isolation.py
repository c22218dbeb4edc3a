"""workers/isolation.py and workers/keeper.py: job cgroups (real cgroup v1 where this host has
it writable; v2 against a directory tree imitating cgroupfs), scratch, OOM, the keeper."""

from __future__ import annotations

import logging
import os
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from broker.config.core import Config, load_config
from broker.cycle.plan import Plan, Start
from broker.model import Allocation, Gpu, JobSpec, Node
from broker.store.memory import MemoryStore
from workers import cgroupfs, keeper
from workers.agent import Agent
from workers.detection import detect
from workers.isolation import Isolation, JobBox
from workers.keeping import Keeper
from workers.runner import RunningPart, Supervisor


def start(box: JobBox, argv: list[str], **kw: Any) -> subprocess.Popen[bytes]:
    """As the runner starts a part: forked inside ``box.entering()``, with ``box.argv``."""
    with box.entering():
        return subprocess.Popen(box.argv(argv), **kw)


def own_cgroups() -> str:
    return Path("/proc/thread-self/cgroup").read_text()


def wait_for(pred: Callable[[], object], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.005)


def alive(pid: int) -> bool:
    """Running and not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return False
    return stat[stat.rfind(b")") + 2:].split()[0] != b"Z"


def v1_usable() -> bool:
    return all(os.access(f"/sys/fs/cgroup/{c}", os.W_OK)
               and os.path.exists(f"/sys/fs/cgroup/{c}/cgroup.procs")
               for c in keeper.V1_CONTROLLERS)


needs_v1 = pytest.mark.skipif(not v1_usable(),
                              reason="cgroup v1 memory/cpu/pids/freezer not writable here")


@pytest.fixture
def v1(tmp_path: Path) -> Iterator[Isolation]:
    iso = detect(f"test-{uuid.uuid4().hex[:8]}", str(tmp_path / "agent"), pids_max=64,
                 v2_root=str(tmp_path / "no-v2"))
    assert iso.kind == "v1", iso.missing
    yield iso
    keeper.kill_node("v1", iso.node_dirs, iso.pgroup_dir)
    for d in iso.node_dirs:
        keeper.remove(d)


def test_config_has_job_pids_max() -> None:
    assert Config().job_pids_max == 4096
    assert load_config(env={"SPILLWAY_JOB_PIDS_MAX": "100"}).job_pids_max == 100


@needs_v1
@pytest.mark.parametrize("way", ["thread", "shell"])
def test_v1_limits_background_processes_and_release(v1: Isolation, way: str) -> None:
    assert v1.by_thread  # what detect picks where a thread can enter a v1 cgroup
    v1.by_thread = way == "thread"
    box = v1.box("j1", 2, 0, memory_gb=0.5, cpus=1.5)
    mem, cpu, pids, _freezer, *_devices = box.dirs
    assert int(Path(mem, "memory.limit_in_bytes").read_text()) == 2**29
    assert Path(cpu, "cpu.cfs_quota_us").read_text().strip() == "150000"
    assert Path(cpu, "cpu.cfs_period_us").read_text().strip() == "100000"
    assert Path(pids, "pids.max").read_text().strip() == "64"
    assert os.path.isdir(box.scratch) and box.env()["TMPDIR"] == box.scratch
    # setsid: the background process leaves the job's process group, not its cgroup
    home = own_cgroups()
    argv = ["sh", "-c", "setsid sleep 300 & sleep 300"]
    assert (box.argv(argv) == argv) is v1.by_thread  # (no shell step when the thread enters)
    p = start(box, argv, start_new_session=True)
    assert own_cgroups() == home  # the forking thread went back to its own cgroups
    box.started(p.pid)
    wait_for(lambda: len(keeper.pids_in(mem)) == 3, 5, "the job's three processes")
    pids_before = keeper.pids_in(mem)
    assert p.pid in pids_before  # born in it, or moved itself in, before the command ran
    t = time.monotonic()
    box.kill()
    wait_for(lambda: not any(alive(x) for x in pids_before), 2, "every process to die")
    killed_in = time.monotonic() - t
    assert killed_in < 1.0
    assert p.wait(5) == -9
    box.release()
    assert not any(os.path.exists(d) for d in box.dirs)
    assert not os.path.exists(box.scratch)


@needs_v1
def test_v1_out_of_memory_is_reported(v1: Isolation) -> None:
    box = v1.box("oom", 1, 0, memory_gb=0.1, cpus=0)
    p = start(box, ["python3", "-c", "b = bytearray(400 * 2**20)"], start_new_session=True)
    rc = p.wait(30)
    assert box.end_reason("Signal", rc) == "OutOfMemory (memory_gb 0.1)"
    box.release()
    ok = v1.box("fine", 1, 0, memory_gb=0.1, cpus=0)
    p = start(ok, ["true"])
    assert ok.end_reason("Exited", p.wait(10)) == "Exited"
    ok.release()


@needs_v1
def test_supervisor_kills_the_whole_cgroup_and_reports_oom(v1: Isolation, tmp_path: Path
                                                           ) -> None:
    store = MemoryStore()
    store.heartbeat(Node("n1", (Gpu("GPU-a", 0, "A100-80GB", 80.0),), incarnation="i"), 1e9, 0)
    ended: list[RunningPart] = []
    sup = Supervisor(store, v1.work_dir, on_exit=ended.append, grace_s=5, isolation=v1)
    pidfile = tmp_path / "bg"
    try:
        def place(**spec: object) -> RunningPart:
            job = store.submit(JobSpec(gpus=0, **spec), 0.0)  # type: ignore[arg-type]
            start = Start(job.id, job.attempt, job.version, (Allocation("n1", ()),))
            assert store.apply(Plan(starts=(start,)), 1.0).started
            return sup.spawn(store.get(job.id), 0, (), "n1")

        # a background process that left the process group dies with the job's end
        part = place(command=f"setsid sleep 300 & echo $! > {pidfile}; echo $TMPDIR")
        wait_for(part.done.is_set, 10, "the job to end")
        assert part.reason == "Exited" and part.exit_code == 0
        bg = int(pidfile.read_text())
        wait_for(lambda: not alive(bg), 2, "the setsid background process to die")
        oom = place(command="python3 -c 'b = bytearray(400 * 2**20)'", memory_gb=0.1)
        wait_for(oom.done.is_set, 30, "the OOM job to end")
        assert oom.reason == "OutOfMemory (memory_gb 0.1)" and oom.exit_code == 137
        assert not os.listdir(v1.node_dirs[0]) or all(
            not os.path.isdir(os.path.join(v1.node_dirs[0], n))
            for n in os.listdir(v1.node_dirs[0]))
        assert not os.listdir(v1.scratch_root)
    finally:
        sup.close()


# its memory cgroup, then the main process's parent-death signal (PR_GET_PDEATHSIG)
PDEATHSIG = ("grep memory /proc/self/cgroup; exec python3 -c 'import ctypes; "
             "s = ctypes.c_int(); ctypes.CDLL(None).prctl(2, ctypes.byref(s)); print(s.value)'")


@needs_v1
def test_jobs_in_cgroups_need_no_parent_death_signal_while_a_keeper_lives(
        v1: Isolation, tmp_path: Path) -> None:
    """With a live keeper a job starts without the setpriv wrapper (one exec less): the keeper
    kills its cgroup if the agent dies. A dead keeper brings the wrapper back until
    ensure() (the agent's heartbeat) starts another."""
    store = MemoryStore()
    store.heartbeat(Node("n1", (), incarnation="i"), 1e9, 0)
    sup = Supervisor(store, v1.work_dir, grace_s=5, isolation=v1)
    keep = Keeper(v1)
    try:
        def output(part: RunningPart) -> list[str]:
            wait_for(part.done.is_set, 10, "the job to end")
            log = Path(v1.work_dir, "logs", f"{part.job_id}.1.log").read_text()
            return [line.split(" ", 1)[1] for line in log.splitlines()]

        def run() -> list[str]:
            job = store.submit(JobSpec(gpus=0, command=PDEATHSIG), 0.0)
            start = Start(job.id, job.attempt, job.version, (Allocation("n1", ()),))
            assert store.apply(Plan(starts=(start,)), 1.0).started
            part = sup.spawn(store.get(job.id), 0, (), "n1")
            return output(part)

        cgroup, signal_ = run()
        assert signal_ == "0"
        node = os.path.basename(v1.node_dirs[0])
        assert f"/{cgroupfs.parent_name()}/{node}/" in cgroup  # its job cgroup
        keep.proc.kill()
        keep.proc.wait(5)
        assert not v1.kept() and run()[1] == "9"  # SIGKILL on the agent's death, as without
        keep.ensure()
        assert v1.kept() and run()[1] == "0"
    finally:
        sup.close()
        keep.stop()


@needs_v1
def test_keeper_kills_the_node_cgroups_when_the_agent_end_closes(v1: Isolation) -> None:
    box = v1.box("k", 1, 0, memory_gb=0, cpus=0)
    p = start(box, ["sh", "-c", "sleep 300 & exec sleep 301"], start_new_session=True)
    wait_for(lambda: len(keeper.pids_in(box.dirs[0])) == 2, 5, "the job's processes")
    pids = keeper.pids_in(box.dirs[0])
    k = Keeper(v1)
    os.close(k._w)  # as the kernel does when the agent dies
    t = time.monotonic()
    wait_for(lambda: not any(alive(x) for x in pids), 5, "the keeper to kill the job")
    assert time.monotonic() - t < 1.0
    assert k.proc.wait(5) == 0
    p.wait(5)
    assert not os.path.exists(box.dirs[0])


@needs_v1
def test_keeper_exits_without_killing_on_a_clean_stop(v1: Isolation) -> None:
    box = v1.box("clean", 1, 0, memory_gb=0, cpus=0)
    p = start(box, ["sleep", "300"], start_new_session=True)
    wait_for(lambda: keeper.pids_in(box.dirs[0]), 5, "the job's process")
    k = Keeper(v1)
    k.stop()
    assert k.proc.returncode == 0 and p.poll() is None
    box.kill()
    p.wait(5)
    box.release()


def test_no_cgroups_warns_once_and_the_keeper_kills_recorded_groups(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="workers.detection"):
        iso = detect("n-none", str(tmp_path / "agent"), v2_root=str(tmp_path / "no-v2"),
                     v1_root=str(tmp_path / "no-v1"))
    assert iso.kind == "none"
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "no cgroup v2 mount" in warnings[0]
    assert "memory hierarchy is not mounted" in warnings[0]
    box = iso.box("j", 1, 0, memory_gb=1, cpus=1)
    assert box.dirs == [] and box.argv(["true"]) == ["true"]
    p = subprocess.Popen(["sh", "-c", "sleep 300 & sleep 300"], start_new_session=True)
    box.started(p.pid)
    assert os.listdir(iso.pgroup_dir) == [str(p.pid)]
    k = Keeper(iso)
    os.close(k._w)
    wait_for(lambda: p.poll() is not None, 5, "the keeper to kill the process group")
    assert k.proc.wait(5) == 0 and not os.listdir(iso.pgroup_dir)
    box.release()
    assert not os.path.exists(box.scratch)


def fake_v2(root: Path, controllers: str = "cpuset cpu io memory hugetlb pids") -> None:
    root.mkdir(parents=True, exist_ok=True)
    (root / "cgroup.controllers").write_text(controllers + "\n")
    (root / "cgroup.subtree_control").write_text("")


def test_v2_paths_against_a_fake_cgroupfs(tmp_path: Path) -> None:
    root = tmp_path / "cg"
    fake_v2(root)
    iso = detect("node/1", str(tmp_path / "agent"), pids_max=99, v2_root=str(root))
    assert iso.kind == "v2"
    node = root / cgroupfs.parent_name() / "node_1"
    assert iso.node_dirs == [str(node)]
    for d in (root, root / cgroupfs.parent_name(), node):
        assert (d / "cgroup.subtree_control").read_text() == "+memory +pids +cpu"
    box = iso.box("j", 3, 1, memory_gb=2, cpus=0.5)
    job = node / "j-3-1"
    assert box.dirs == [str(job)]
    assert (job / "memory.max").read_text() == str(2 * 2**30)
    assert (job / "cpu.max").read_text() == "50000 100000"
    assert (job / "pids.max").read_text() == "99"
    argv = box.argv(["python3", "train.py"])
    assert argv[:2] == ["/bin/sh", "-c"] and str(job / "cgroup.procs") in argv[2]
    assert argv[3:] == ["sh", "python3", "train.py"]
    # the shell step really writes its own pid before exec'ing the command
    out = subprocess.run(box.argv(["sh", "-c", "echo $$"]), capture_output=True, text=True,
                         check=True).stdout.strip()
    assert (job / "cgroup.procs").read_text().strip() == out
    box.kill()
    assert (job / "cgroup.kill").read_text() == "1"
    assert box.end_reason("Exited", 0) == "Exited"
    (job / "memory.events").write_text("low 0\nhigh 0\nmax 5\noom 1\noom_kill 1\n")
    assert box.end_reason("Signal", -9) == "OutOfMemory (memory_gb 2)"


def test_v2_without_delegated_controllers_falls_back(tmp_path: Path,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    root = tmp_path / "cg"
    fake_v2(root, controllers="cpu io")
    with caplog.at_level(logging.WARNING, logger="workers.detection"):
        iso = detect("n", str(tmp_path / "agent"), v2_root=str(root),
                     v1_root=str(tmp_path / "no-v1"))
    assert iso.kind == "none"
    assert "controllers memory, pids not delegated" in iso.missing
    assert "controllers memory, pids not delegated" in caplog.text


def test_keeper_v2_kill_writes_cgroup_kill(tmp_path: Path) -> None:
    node = tmp_path / "spillway" / "n"
    for name in ("a-1-0", "b-1-0"):
        (node / name).mkdir(parents=True)
    threading.Thread(target=keeper.kill_node, args=("v2", [str(node)], str(tmp_path / "pg")),
                     daemon=True).start()
    wait_for(lambda: all((node / n / "cgroup.kill").exists() for n in ("a-1-0", "b-1-0")), 5,
             "cgroup.kill in each job cgroup")


def test_a_clean_stop_leaves_no_empty_cgroup_of_the_node(v1: Isolation) -> None:
    box = v1.box("gone", 1, 0, memory_gb=0, cpus=0)
    box.release()  # (an ended part's cgroup is removed; an empty leftover may stay)
    os.makedirs(os.path.join(v1.node_dirs[0], "leftover-1-0"), exist_ok=True)
    Keeper(v1).stop()
    assert not any(os.path.exists(d) for d in v1.node_dirs)


@needs_v1
def test_an_agent_start_reclaims_the_job_cgroups_a_crash_left(tmp_path: Path) -> None:
    """The agent and its keeper died together (a power cut, kill -9 of both): the next agent
    of the node kills what is still in the old job cgroups (here a process without the node
    id in its environment, which the /proc scan cannot tell apart) and removes them all."""
    node = f"crash-{uuid.uuid4().hex[:8]}"
    work = str(tmp_path / "agent")
    old = detect(node, work, warn=False)
    box = old.box("left", 1, 0, memory_gb=0, cpus=0)
    p = start(box, ["env", "-i", "sleep", "300"], start_new_session=True)
    wait_for(lambda: keeper.pids_in(box.dirs[0]), 5, "the leftover's process")
    agent = Agent(MemoryStore(), Config(heartbeat_s=60.0, job_isolation=False),
                  Node(node, (), incarnation="i2"), work)
    try:
        assert agent.register()
        assert p.wait(5) == -9
        assert not any(os.path.isdir(os.path.join(d, n))
                       for d in agent.isolation.node_dirs for n in os.listdir(d))
    finally:
        agent.close()
        for d in old.node_dirs:
            keeper.remove(d, wait_s=0)


@needs_v1
def test_reclaim_spares_the_jobs_of_a_live_agent(v1: Isolation) -> None:
    box = v1.box("live", 1, 0, memory_gb=0, cpus=0)
    p = start(box, ["sleep", "300"], start_new_session=True)
    wait_for(lambda: keeper.pids_in(box.dirs[0]), 5, "the job's process")
    assert v1.reclaim(spare=lambda pid: pid == p.pid) == 0
    assert p.poll() is None and all(os.path.isdir(d) for d in box.dirs)
    assert v1.reclaim(spare=lambda pid: False) == 1
    assert p.wait(5) == -9 and not any(os.path.exists(d) for d in box.dirs)
