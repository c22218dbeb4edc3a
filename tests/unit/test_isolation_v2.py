"""The cgroup v2 path of workers/isolation.py on a real cgroup2 mount (not a fake tree).

A hybrid host (cgroup v1 controllers, plus cgroup2 at ``/sys/fs/cgroup/unified`` with no
controllers) still has v2 membership: ``cgroup.procs``, ``cgroup.kill`` and ``cgroup.events``.
These tests run the v2 way of making the node's and a job's cgroups, the shell step that moves
the job in, the kill of the whole cgroup, its removal and the keeper's kill on that mount, with
``v2_controllers=()`` (no limits there to set; the limit files are what the fake-tree test in
test_isolation.py covers). Each scenario runs in a child process placed in a cgroup of its own,
so detecting a delegated subtree never moves the test process. Skipped where no writable
cgroup2 mount exists.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from workers import cgroupfs, keeper

REPO = str(Path(__file__).resolve().parents[2])


def cgroup2_mount() -> str | None:
    """A cgroup2 mount where this process may make cgroups."""
    for line in Path("/proc/self/mounts").read_text().splitlines():
        parts = line.split()
        if len(parts) > 2 and parts[2] == "cgroup2" and os.access(parts[1], os.W_OK):
            return parts[1]
    return None


def alive(pid: int) -> bool:
    """Running and not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return False
    return stat[stat.rfind(b")") + 2:].split()[0] not in (b"Z", b"X")


ROOT = cgroup2_mount()
pytestmark = pytest.mark.skipif(ROOT is None, reason="no writable cgroup2 mount here")

# The child: detect (v2, no controllers), one job with a background process that leaves its
# process group, the job killed as a whole; a second job left to the keeper; then what it saw.
CHILD = r"""
import json, os, subprocess, sys, threading, time
sys.path.insert(0, sys.argv[1])
from workers import keeper
from workers.detection import detect
from workers.keeping import Keeper

root, node, work = sys.argv[2:5]

def until(pred, what, timeout=5.0):
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise SystemExit("timed out waiting for " + what)
        time.sleep(0.002)

def events(d):
    return dict(line.split() for line in open(os.path.join(d, "cgroup.events")))

iso = detect(node, work, v2_root=root, v2_controllers=(), warn=False)
out = {"kind": iso.kind, "node_dirs": iso.node_dirs,
       "own": open("/proc/self/cgroup").read().strip()}
box = iso.box("j", 1, 0, memory_gb=0, cpus=0)
argv = box.argv(["sh", "-c", "setsid sleep 300 & exec sleep 301"])
with box.entering():
    p = subprocess.Popen(argv, start_new_session=True)
until(lambda: len(keeper.pids_in(box.dirs[0])) == 2, "the job's two processes")
out.update(job_dir=box.dirs[0], shell_step=argv[:2], pids=keeper.pids_in(box.dirs[0]),
           main=p.pid, populated=events(box.dirs[0])["populated"])
box.kill()
out["exit"] = p.wait(5)
until(lambda: events(box.dirs[0])["populated"] == "0", "the cgroup to empty")
box.release()
out["removed"] = not os.path.exists(box.dirs[0])

left = iso.box("k", 1, 0, memory_gb=0, cpus=0)
with left.entering():
    q = subprocess.Popen(left.argv(["sh", "-c", "sleep 300 & exec sleep 301"]),
                         start_new_session=True)
until(lambda: len(keeper.pids_in(left.dirs[0])) == 2, "the second job's processes")
k = Keeper(iso)
reaper = threading.Thread(target=q.wait)  # (a dead agent's jobs are reaped by init)
reaper.start()
os.close(k._w)  # as the kernel does when the agent dies
out["keeper_exit"] = k.proc.wait(10)
reaper.join(5)
out["left_exit"] = q.returncode
out["left_removed"] = not os.path.exists(left.dirs[0])
print(json.dumps(out))
"""


@pytest.fixture
def home() -> Iterator[Path]:
    """A cgroup of the test's own on the mount, removed with what was made under it."""
    assert ROOT is not None
    path = Path(ROOT, f"spillway-test-{uuid.uuid4().hex[:8]}")
    path.mkdir()
    try:
        yield path
    finally:
        for d in sorted((p for p in path.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
            keeper.kill_v2(str(d))
            keeper.remove(str(d))
        keeper.remove(str(path))


def run_child(cgroup: Path, node: str, work: Path) -> dict[str, object]:
    """The child, moved into ``cgroup`` before it runs a line of Python."""
    assert ROOT is not None
    code = f'echo $$ > {cgroup}/cgroup.procs && exec "$@"'
    done = subprocess.run(["sh", "-c", code, "sh", sys.executable, "-c", CHILD, REPO, ROOT, node,
                           str(work)], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    result: dict[str, object] = json.loads(done.stdout)
    return result


def test_v2_membership_kill_and_keeper_on_a_real_mount(home: Path, tmp_path: Path) -> None:
    assert ROOT is not None
    node = f"v2-{uuid.uuid4().hex[:8]}"
    out = run_child(home, node, tmp_path / "agent")
    node_dir = os.path.join(ROOT, cgroupfs.parent_name(), node)
    try:
        assert out["kind"] == "v2" and out["node_dirs"] == [node_dir]  # not delegated: /spillway
        assert out["job_dir"] == os.path.join(node_dir, "j-1-0")
        assert out["shell_step"] == ["/bin/sh", "-c"]  # v2: the job moves itself in
        pids = out["pids"]
        assert isinstance(pids, list) and out["main"] in pids and len(pids) == 2
        assert out["populated"] == "1"
        assert out["exit"] == -9 and out["removed"]  # cgroup.kill took the setsid'd one too
        assert not any(alive(pid) for pid in pids)
        assert out["keeper_exit"] == 0 and out["left_exit"] == -9 and out["left_removed"]
    finally:
        keeper.remove(node_dir)


def test_v2_delegated_subtree_holds_the_agent_and_its_jobs(home: Path, tmp_path: Path) -> None:
    """As under systemd's Delegate=yes: the agent's own cgroup carries trusted.delegate=1; the
    agent moves into <own>/agent and its jobs go to <own>/jobs, nowhere else on the mount."""
    assert ROOT is not None
    os.setxattr(home, "trusted.delegate", b"1")
    out = run_child(home, f"d-{uuid.uuid4().hex[:8]}", tmp_path / "agent")
    jobs = str(home / "jobs")
    assert out["kind"] == "v2" and out["node_dirs"] == [jobs]
    assert f"0::/{home.name}/agent" in str(out["own"]).splitlines()
    assert out["job_dir"] == os.path.join(jobs, "j-1-0")
    assert out["exit"] == -9 and out["removed"] and out["left_removed"]
    assert sorted(p.name for p in home.iterdir() if p.is_dir()) == ["agent", "jobs"]
