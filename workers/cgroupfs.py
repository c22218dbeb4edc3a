"""The cgroup file system: where a node's job cgroups go, and moving a thread in and out.

:mod:`workers.isolation` decides what a job gets; this module only knows paths and files.

Where a node's job cgroups live (``node_dirs``; a job's cgroup is ``<node_dir>/<job>-<attempt>-
<rank>``):

* **v2, delegated** (the agent's own cgroup is delegated to it: systemd's ``Delegate=yes`` marks
  it with the ``trusted.delegate`` or ``user.delegate`` extended attribute; or an unprivileged
  agent owns it): inside that subtree. A v2 cgroup with processes cannot hand controllers to
  children, so the agent first moves the subtree's processes (itself) into ``<own>/agent``, then
  enables the controllers in ``<own>`` and makes ``<own>/jobs``;
* **v2, not delegated**: ``<mount>/spillway/<node>``, the controllers enabled on the way down
  (a root agent outside any delegated subtree);
* **v1**: ``<hierarchy>/spillway/<node>`` in each of memory, cpu, pids and freezer, and in
  ``devices`` where that hierarchy is mounted and writable (optional: :func:`make_v1_devices`).
"""

from __future__ import annotations

import errno
import logging
import os
import re

from workers import keeper

log = logging.getLogger(__name__)

V2_CONTROLLERS = ("memory", "pids", "cpu")
V1_DEVICES = "devices"  # the optional v1 hierarchy (beside keeper.V1_CONTROLLERS)
DELEGATE_XATTRS = ("trusted.delegate", "user.delegate")  # set by systemd (>= 251) on Delegate=yes

read = keeper._read  # (a file's text, or "" when it cannot be read)
write = keeper.write  # (OSError if it cannot)


PARENT_VAR = "SPILLWAY_CGROUP_PARENT"


def parent_name() -> str:
    """The cgroup under each hierarchy (v1) or the root (v2) that holds this host's Spillway
    node cgroups: ``spillway``, or ``$SPILLWAY_CGROUP_PARENT`` where agents of two clusters
    with the same node ids share a host (and the test suite's parallel workers). An agent
    removes the empty job cgroups of its node id when it starts, so they must not share it."""
    name = os.environ.get(PARENT_VAR, "") or "spillway"
    if name in (".", "..") or not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
        raise OSError(f"{PARENT_VAR}={name!r}: a cgroup name is letters, digits, '-', '_' "
                      "and '.'")
    return name


# -- v1 --------------------------------------------------------------------------------------


def make_v1(root: str, node: str) -> list[str]:
    """``<root>/<c>/spillway/<node>`` for each v1 controller (:func:`parent_name`); OSError
    saying what is missing."""
    return [_v1_node_dir(root, c, "cgroup.procs", node) for c in keeper.V1_CONTROLLERS]


def make_v1_devices(root: str, node: str) -> str:
    """``<root>/devices/spillway/<node>``: the optional devices hierarchy's node directory;
    OSError saying what is missing."""
    return _v1_node_dir(root, V1_DEVICES, "devices.allow", node)


def _v1_node_dir(root: str, controller: str, marker: str, node: str) -> str:
    """``<root>/<controller>/<parent>/<node>``, made; OSError if the hierarchy (its
    ``marker`` file) is not there or the directory cannot be made."""
    h = os.path.join(root, controller)
    if not os.path.exists(os.path.join(h, marker)):
        raise OSError(f"the {controller} hierarchy is not mounted at {h}")
    d = os.path.join(h, parent_name(), node)
    try:
        os.makedirs(d, exist_ok=True)
    except OSError as e:
        raise OSError(f"cannot create {d}: {e.strerror}") from None
    return d


def hierarchy(node_dir: str) -> str:
    """The v1 hierarchy (``/sys/fs/cgroup/memory``) of a node directory ``<h>/spillway/<node>``."""
    return os.path.dirname(os.path.dirname(node_dir))


def own_v1_cgroups() -> dict[str, str]:
    """The calling thread's v1 cgroups: hierarchy name (``memory``, ``cpu,cpuacct``) -> path;
    each controller of a joined hierarchy maps too."""
    out: dict[str, str] = {}
    for line in read("/proc/thread-self/cgroup").splitlines():
        _, names, path = line.split(":", 2)
        if names:
            out[names] = path
            for n in names.split(","):
                out[n] = path
    return out


def open_home(node_dirs: list[str]) -> list[int]:
    """The calling thread's own ``tasks`` file in each v1 hierarchy of ``node_dirs``, open."""
    own = own_v1_cgroups()
    fds: list[int] = []
    try:
        for d in node_dirs:
            h = hierarchy(d)
            path = os.path.join(h, own.get(os.path.basename(h), "/").lstrip("/"), "tasks")
            fds.append(os.open(path, os.O_WRONLY | os.O_CLOEXEC))
    except OSError:
        for fd in fds:
            os.close(fd)
        raise
    return fds


def enter(dirs: list[str]) -> None:
    """Move the calling thread (not its process) into these v1 cgroups (``0``: the writer)."""
    for d in dirs:
        write(os.path.join(d, "tasks"), "0")


def go_home(home: list[int], node_dirs: list[str]) -> None:
    """Write the calling thread back to its own cgroups. Failing that (its own cgroup was
    removed), to each hierarchy's root, so that it never stays in a job's cgroup."""
    for fd, d in zip(home, node_dirs):
        try:
            os.write(fd, b"0")
        except OSError as e:
            log.error("cannot move the job-starting thread back to its cgroup (%s); moving it "
                      "to the root of %s", e, hierarchy(d))
            write(os.path.join(hierarchy(d), "tasks"), "0")


# -- v2 --------------------------------------------------------------------------------------


def own_v2_cgroup(pid: int | str = "self") -> str:
    """This process's cgroup in the unified hierarchy (``0::<path>``), ``/`` if none."""
    for line in read(f"/proc/{pid}/cgroup").splitlines():
        if line.startswith("0::"):
            return line[3:].strip() or "/"
    return "/"


def delegated(path: str) -> bool:
    """Is this v2 cgroup delegated to us: marked by systemd, or owned by this (non-root) user?"""
    for name in DELEGATE_XATTRS:
        try:
            if os.getxattr(path, name).strip() in (b"1", b"yes", b"true"):
                return True
        except OSError:
            continue
    try:
        uid = os.geteuid()
        return uid != 0 and os.stat(path).st_uid == uid
    except OSError:
        return False


def make_v2(root: str, node: str, controllers: tuple[str, ...] = V2_CONTROLLERS) -> str:
    """The node directory on the cgroup2 mount ``root`` (see the module's docstring), with
    ``controllers`` enabled for the jobs below it; OSError saying what is missing."""
    own = own_v2_cgroup()
    base = os.path.join(root, own.lstrip("/"))
    top = base if own != "/" and delegated(base) else root
    have = read(os.path.join(top, "cgroup.controllers")).split()
    lacking = [c for c in controllers if c not in have]
    if lacking:
        raise OSError(f"controllers {', '.join(lacking)} not delegated "
                      f"(cgroup.controllers of {top}: {' '.join(have) or 'empty'})")
    if top == base:
        return _make_delegated(base, controllers)
    path = root
    for part in (parent_name(), node):
        enable(path, controllers)
        path = os.path.join(path, part)
        os.makedirs(path, exist_ok=True)
    enable(path, controllers)
    return path


def _make_delegated(base: str, controllers: tuple[str, ...]) -> str:
    """``<base>/jobs`` in the agent's delegated cgroup, after moving the processes of
    ``<base>`` (the agent, and whatever the unit started with it) into ``<base>/agent``."""
    leaf = os.path.join(base, "agent")
    os.makedirs(leaf, exist_ok=True)
    for _ in range(10):  # (a process the unit forks meanwhile shows up in the next read)
        pids = keeper.pids_in(base)
        if not pids:
            break
        for pid in pids:
            try:
                write(os.path.join(leaf, "cgroup.procs"), str(pid))
            except ProcessLookupError:
                continue
            except OSError as e:
                if e.errno != errno.ESRCH:
                    raise OSError(f"cannot move process {pid} into {leaf}: {e.strerror}"
                                  ) from None
    enable(base, controllers)
    jobs = os.path.join(base, "jobs")
    os.makedirs(jobs, exist_ok=True)
    enable(jobs, controllers)
    return jobs


def enable(path: str, controllers: tuple[str, ...]) -> None:
    """Enable ``controllers`` for the children of ``path`` (``cgroup.subtree_control``)."""
    if not controllers:
        return
    ctl = os.path.join(path, "cgroup.subtree_control")
    if all(c in read(ctl).split() for c in controllers):
        return
    want = " ".join("+" + c for c in controllers)
    try:
        write(ctl, want)
    except OSError as e:
        raise OSError(f"cannot enable {want} in {ctl}: {e.strerror}") from None
