"""Per-job isolation: one cgroup per job part and a scratch directory (:class:`JobBox`), within
what the host allows (:class:`Isolation`).

:func:`workers.detection.detect` runs once at agent start and picks what the host allows:

* **cgroup v2**: the unified mount has memory, pids and cpu in ``cgroup.controllers`` and
  ``<root>/spillway/<node_id>`` can be made with them enabled in ``cgroup.subtree_control``;
* **cgroup v1**: the memory, cpu, pids and freezer hierarchies are mounted and writable; a job
  gets the same relative path ``spillway/<node_id>/<job>-<attempt>-<rank>`` in each (and in
  ``devices`` where that one is mounted and writable);
* **none**: one warning naming what is missing; jobs are killed by process group, as before.

Devices (``fence``): a job's cgroup allows only the device nodes :mod:`workers.devices` lists for
its GPUs (pseudo devices, NVIDIA's control devices, its own ``/dev/nvidiaN``): v1 through the
``devices`` hierarchy (``devices.deny a``, then ``devices.allow``), v2 through a device program
attached to the job's cgroup (:mod:`workers.devbpf`). Both are set when the cgroup is made,
before any process enters it. :func:`~workers.detection.detect` tries the fence once on a probe
cgroup; where it cannot be had, one warning says why and that GPUs are then fenced only by
``CUDA_VISIBLE_DEVICES``.

Each job part gets a :class:`JobBox`: its cgroup (memory limit = ``memory_gb``, CPU quota =
``cpus``, ``job_pids_max`` processes), its scratch directory ``<work_dir>/scratch/<job>-<attempt>-
<rank>`` (``SPILLWAY_SCRATCH_DIR`` and ``TMPDIR``), removed when the part ends.

How the job's process gets into its cgroup before it runs a line of the job's command:

* **v1** (``Isolation.by_thread``): the thread that forks it (the runner's supervisor thread)
  writes its own thread id to the ``tasks`` file of each of the job's hierarchies, forks (a
  child is born in its parent thread's cgroups), and writes itself back home
  (:meth:`JobBox.entering`). No exec is added; a v1 thread may sit in other cgroups than its
  process. A host where that probe fails at start gets the v2 way;
* **v2** (a thread cannot leave its process's cgroup there): the job's argv is prefixed with
  ``sh -c 'echo $$ > <cgroup.procs>...; exec "$@"'`` (no ``preexec_fn``, so Popen keeps using
  vfork/posix_spawn).

:meth:`JobBox.kill` kills the whole cgroup, background processes included. The keeper
(:mod:`workers.keeper`, started by :class:`workers.keeping.Keeper`) kills the node's job
cgroups when the agent dies; while it runs, a job in a cgroup needs no parent-death signal
(:meth:`Isolation.kept`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shlex
import shutil
import signal
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from broker.model import Gpu
from workers import cgroupfs, devices, keeper
from workers.cgroupfs import V2_CONTROLLERS

log = logging.getLogger(__name__)

CPU_PERIOD_US = 100_000

_read, _write = cgroupfs.read, cgroupfs.write


def safe_name(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in text) or "_"


class KeeperHandle(Protocol):
    """What the isolation and the agent use of the keeper watching the node's cgroups
    (:class:`workers.keeping.Keeper`)."""

    def alive(self) -> bool: ...

    def ensure(self) -> None: ...


@dataclass
class Isolation:
    """What this host allows, detected once per agent. ``kind``: v2, v1 or none."""

    kind: str
    node_dirs: list[str]  # v2: one directory; v1: one per hierarchy (memory, cpu, pids, freezer)
    work_dir: str
    pids_max: int = 4096
    missing: str = ""  # why there are no cgroups (kind none)
    by_thread: bool = False  # v1: the forking thread enters the job's cgroups (no sh step)
    controllers: tuple[str, ...] = V2_CONTROLLERS  # v2: those enabled for the jobs
    keeper: KeeperHandle | None = None  # set while a keeper watches this node's cgroups
    _memsw: bool | None = None  # v1: memory.memsw.* exists (swap accounting), probed once
    gpus: tuple[Gpu, ...] = ()  # the node's GPUs: their /dev/nvidiaN minors
    fence: str = ""  # how a job's devices are fenced: v1 (devices cgroup), bpf (v2), "" none
    fence_missing: str = ""  # why they are not (fence "")
    _homes: threading.local = field(default_factory=threading.local)

    def kept(self) -> bool:
        """A live keeper will kill the job cgroups if the agent dies."""
        return self.keeper is not None and self.keeper.alive()

    def home_fds(self) -> list[int]:
        """v1: the calling thread's own ``tasks`` file in each hierarchy, opened once per
        thread (where :meth:`JobBox.entering` sends it back)."""
        fds: list[int] | None = getattr(self._homes, "fds", None)
        if fds is None:
            fds = self._homes.fds = cgroupfs.open_home(self.node_dirs)
        return fds

    @property
    def pgroup_dir(self) -> str:
        """Without cgroups: one empty file per running job's process group, for the keeper."""
        return os.path.join(self.work_dir, "pgroups")

    @property
    def scratch_root(self) -> str:
        return os.path.join(self.work_dir, "scratch")

    def box(self, job_id: str, attempt: int, rank: int, memory_gb: float, cpus: float,
            gpu_ids: Sequence[str] = ()) -> JobBox:
        """Create the part's scratch directory and cgroup; the cgroup may open only the
        devices of ``gpu_ids`` (the part's GPUs or MIG instances) among device nodes. A cgroup
        that cannot be made is logged and the part runs without one (killed by process group);
        a device fence that cannot be set fails the start (:class:`devices.FenceError`)."""
        name = safe_name(f"{job_id}-{attempt}-{rank}")
        scratch = os.path.join(self.scratch_root, name)
        os.makedirs(scratch, exist_ok=True)
        box = JobBox(self, name, memory_gb, scratch)
        if self.kind != "none":
            try:
                box.dirs = self._make_cgroup(name, memory_gb, cpus, gpu_ids)
            except devices.FenceError:
                box.release()
                raise
            except OSError as e:
                log.warning("job %s: no cgroup (%s); it is killed by process group", name, e)
                box.dirs = []
        return box

    def _make_cgroup(self, name: str, memory_gb: float, cpus: float,
                     gpu_ids: Sequence[str] = ()) -> list[str]:
        dirs = [os.path.join(d, name) for d in self.node_dirs]
        for d in dirs:
            try:
                os.mkdir(d)
            except FileExistsError:  # a leftover of an earlier attempt with the same name
                if self.kind == "v2":
                    keeper.kill_v2(d)
                else:
                    keeper.kill_v1([d])
                keeper.remove(d)
                os.makedirs(d, exist_ok=True)
        mem = int(memory_gb * 2**30) if memory_gb > 0 else 0
        quota = int(cpus * CPU_PERIOD_US) if cpus > 0 else 0
        if self.kind == "v2":
            d, on = dirs[0], self.controllers
            if mem and "memory" in on:
                _write(os.path.join(d, "memory.max"), str(mem))
                if os.path.exists(os.path.join(d, "memory.swap.max")):
                    _write(os.path.join(d, "memory.swap.max"), "0")
            if quota and "cpu" in on:
                _write(os.path.join(d, "cpu.max"), f"{max(quota, 1000)} {CPU_PERIOD_US}")
            if "pids" in on:
                _write(os.path.join(d, "pids.max"), str(self.pids_max))
        else:
            by = {os.path.basename(cgroupfs.hierarchy(n)): d
                  for n, d in zip(self.node_dirs, dirs)}
            if mem:
                _write(os.path.join(by["memory"], "memory.limit_in_bytes"), str(mem))
                memsw = os.path.join(by["memory"], "memory.memsw.limit_in_bytes")
                if self._memsw is None:
                    self._memsw = os.path.exists(memsw)
                if self._memsw:
                    _write(memsw, str(mem))
            if quota:  # (a new cgroup's cfs_period_us is the kernel's fixed default, 100 ms)
                _write(os.path.join(by["cpu"], "cpu.cfs_quota_us"), str(max(quota, 1000)))
            _write(os.path.join(by["pids"], "pids.max"), str(self.pids_max))
        if self.fence:
            self._fence(dirs, gpu_ids)
        return dirs

    def _fence(self, dirs: list[str], gpu_ids: Sequence[str]) -> None:
        """Allow the job's cgroup ``dirs`` only its devices (before anything enters it)."""
        target = dirs[0] if self.fence == devices.BPF else dirs[-1]  # (v1: devices is last)
        try:
            devices.apply(self.fence, target, devices.rules_for(self.gpus, gpu_ids))
        except devices.FenceError:
            for d in dirs:  # (empty: nothing entered them yet)
                keeper.remove(d, wait_s=0)
            raise

    def clean_leftovers(self) -> None:
        """Remove the empty job cgroups and stale process-group files an earlier agent left.
        Populated ones are left to :func:`workers.procs.kill_leftovers` (it knows whether
        their agent still lives)."""
        for d in self.node_dirs:
            for name in keeper._listdir(d):
                if os.path.isdir(os.path.join(d, name)):
                    keeper.remove(os.path.join(d, name), wait_s=0)
        for name in keeper._listdir(self.pgroup_dir):
            if not name.isdigit() or not _group_alive(int(name)):
                with _quiet():
                    os.unlink(os.path.join(self.pgroup_dir, name))


    def reclaim(self, spare: Callable[[int], bool]) -> int:
        """Kill and remove the job cgroups an earlier agent of this node left with processes
        in them (its keeper died with it), except those of a live agent (``spare``)."""
        n = keeper.reclaim(self.kind, self.node_dirs, spare) if self.kind != "none" else 0
        if n:
            log.warning("killed the processes of %d job cgroup(s) that an earlier agent of this "
                        "node left, and removed them", n)
        return n


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except OSError:
        return False


class _quiet:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> bool:
        return exc[0] is not None and issubclass(exc[0], OSError)  # type: ignore[arg-type]


@dataclass(eq=False)
class JobBox:
    """One job part's cgroup (``dirs``; empty: none) and scratch directory."""

    iso: Isolation
    name: str
    memory_gb: float
    scratch: str
    dirs: list[str] = field(default_factory=list)
    pgid: int | None = None
    _release_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    released: bool = False  # set once :meth:`release` is done (by whichever thread)

    def argv(self, argv: list[str]) -> list[str]:
        """``argv`` as the part's process runs it: unchanged where the forking thread puts it
        in its cgroup (:meth:`entering`), else run by a shell step that first moves itself
        into the cgroup. Start it inside :meth:`entering` either way."""
        if not self.dirs or self.iso.by_thread:
            return argv
        procs = " ".join(shlex.quote(os.path.join(d, "cgroup.procs")) for d in self.dirs)
        step = f'for f in {procs}; do echo $$ > "$f" || exit 125; done; exec "$@"'
        return ["/bin/sh", "-c", step, "sh", *argv]

    @contextlib.contextmanager
    def entering(self) -> Iterator[None]:
        """v1 (``by_thread``): the calling thread sits in the part's cgroups for the block, so
        the process it forks there is born in them, then goes back to its own. Elsewhere a
        no-op. OSError if the thread cannot enter (it is back home then)."""
        if not (self.dirs and self.iso.by_thread):
            yield
            return
        home = self.iso.home_fds()  # (opened before leaving home)
        try:
            cgroupfs.enter(self.dirs)
            yield
        finally:
            cgroupfs.go_home(home, self.iso.node_dirs)

    def env(self) -> dict[str, str]:
        return {"SPILLWAY_SCRATCH_DIR": self.scratch, "TMPDIR": self.scratch}

    def started(self, pid: int) -> None:
        """The part's process runs (its process group is ``pid``). Without a cgroup the keeper
        learns the group from an empty file named after it."""
        self.pgid = pid
        if not self.dirs:
            try:
                os.makedirs(self.iso.pgroup_dir, exist_ok=True)
                open(os.path.join(self.iso.pgroup_dir, str(pid)), "w").close()
            except OSError as e:
                log.warning("cannot record process group %d for the keeper: %s", pid, e)

    def kill(self) -> None:
        """SIGKILL every process of the part: its cgroup, or its process group."""
        if self.iso.kind == "v2" and self.dirs:
            keeper.kill_v2(self.dirs[0])
        elif self.dirs:
            keeper.kill_v1(self.dirs)
        if self.pgid is not None:
            with _quiet():
                os.killpg(self.pgid, signal.SIGKILL)

    def oom_killed(self, returncode: int) -> bool:
        """Did the kernel's OOM killer kill a process of this cgroup?"""
        if not self.dirs:
            return False
        if self.iso.kind == "v2":
            return _field(_read(os.path.join(self.dirs[0], "memory.events")), "oom_kill") > 0
        mem = next((d for d in self.dirs if "/memory/" in d), self.dirs[0])
        control = _read(os.path.join(mem, "memory.oom_control"))
        if "oom_kill " in control:
            return _field(control, "oom_kill") > 0
        failcnt = _read(os.path.join(mem, "memory.failcnt")).strip()  # old kernels
        return returncode == -signal.SIGKILL and failcnt.isdigit() and int(failcnt) > 0

    def end_reason(self, reason: str, returncode: int) -> str:
        """``reason``, or ``OutOfMemory (memory_gb N)`` after an OOM kill."""
        if self.oom_killed(returncode):
            return f"OutOfMemory (memory_gb {self.memory_gb:g})"
        return reason

    def release(self) -> None:
        """After the part ended: kill what is left, remove the cgroup and the scratch. Done
        once: a call from another thread meanwhile waits until it is done, a later one
        returns at once (:attr:`released` is set when it is done)."""
        with self._release_lock:
            if self.released:
                return
            if self.dirs:
                self.kill()
                for d in self.dirs:
                    if not keeper.remove(d):
                        log.warning("job cgroup %s not removed: processes still in it", d)
            elif self.pgid is not None:
                with _quiet():
                    os.unlink(os.path.join(self.iso.pgroup_dir, str(self.pgid)))
            try:
                os.rmdir(self.scratch)  # the usual case, and a fraction of rmtree's cost
            except OSError:
                shutil.rmtree(self.scratch, ignore_errors=True)
            self.released = True


def _field(text: str, key: str) -> int:
    for line in text.splitlines():
        k, _, v = line.partition(" ")
        if k == key and v.strip().isdigit():
            return int(v)
    return 0
