"""The keeper: kills an agent's jobs when the agent dies, however it dies.

One keeper per agent, started by :func:`workers.isolation.start_keeper` as
``python -S -c 'from workers.keeper import main; main()' ...`` in its own session, so a SIGKILL
of the agent (or of its process group) does not reach it. It blocks reading a pipe whose write
end only the agent holds:

* EOF (the agent is gone, even after SIGKILL or an OOM kill): kill every job cgroup under the
  agent's node subtree (v2: ``cgroup.kill``; v1: freeze, SIGKILL each pid, thaw), SIGKILL the
  process groups recorded in the agent's process-group directory (no cgroups), remove what it
  can, exit;
* one byte ``q`` (the agent stops cleanly and killed its jobs itself): exit.

This module imports only the standard library's contextlib, os, signal, sys and time, so the
keeper starts in a few milliseconds; :mod:`workers.isolation` uses the same kill functions.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from collections.abc import Callable

V1_CONTROLLERS = ("memory", "cpu", "pids", "freezer")


def _read(path: str) -> str:
    """The file's text, or "" when it cannot be read. (os-level calls: a cgroup file read
    through open() costs about three times as much, and a job start reads several.)"""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return ""
    try:
        chunks = []
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
        return b"".join(chunks).decode(errors="replace")
    except OSError:
        return ""
    finally:
        os.close(fd)


def write(path: str, text: str) -> None:
    """Write ``text`` to a cgroup (or any) file, as open(path, "w") would; OSError if it
    cannot."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def _write(path: str, text: str) -> bool:
    try:
        write(path, text)
        return True
    except OSError:
        return False


def pids_in(path: str) -> list[int]:
    """The pids in the cgroup directory ``path`` (``cgroup.procs``)."""
    return [int(x) for x in _read(os.path.join(path, "cgroup.procs")).split() if x.isdigit()]


def kill_v2(path: str) -> None:
    """SIGKILL every process of a v2 cgroup (``cgroup.kill``, Linux 5.14; else pid by pid)."""
    if not _write(os.path.join(path, "cgroup.kill"), "1"):
        _kill_pids(path)


def kill_v1(paths: list[str]) -> None:
    """SIGKILL every process of a v1 job cgroup: ``paths`` are its directories, the freezer's
    among them. Frozen first, so no process can fork a child the loop would miss."""
    if not any(pids_in(p) for p in paths):
        return  # empty: no process is left that could fork (the usual end of a job)
    freezer = next((p for p in paths if "/freezer/" in p), None)
    frozen = freezer is not None and _write(os.path.join(freezer, "freezer.state"), "FROZEN")
    if frozen:
        assert freezer is not None
        deadline = time.monotonic() + 1.0
        while (_read(os.path.join(freezer, "freezer.state")).strip() != "FROZEN"
               and time.monotonic() < deadline):
            time.sleep(0.001)
    for p in paths:
        _kill_pids(p)
    if frozen:
        assert freezer is not None
        _write(os.path.join(freezer, "freezer.state"), "THAWED")  # let SIGKILL be delivered


def _kill_pids(path: str) -> None:
    me = os.getpid()  # (never the agent itself, should a thread of it sit in a job cgroup)
    for pid in pids_in(path):
        if pid == me:
            continue
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def remove(path: str, wait_s: float = 2.0) -> bool:
    """rmdir a job cgroup once its processes are gone (they may take a moment to exit)."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            os.rmdir(path)
            return True
        except FileNotFoundError:
            return True
        except NotADirectoryError:
            return False
        except OSError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.005)


def kill_node(kind: str, node_dirs: list[str], pgroup_dir: str) -> int:
    """Kill every job under the node's cgroup directories (``kind`` v2 or v1: one directory,
    or one per v1 hierarchy) and every process group listed in ``pgroup_dir``; remove the job
    cgroups. Returns how many job cgroups and process groups were killed."""
    n = 0
    if kind == "v2":
        for d in node_dirs:
            jobs = [os.path.join(d, name) for name in _listdir(d)
                    if os.path.isdir(os.path.join(d, name))]  # (not the node's own files)
            for job in jobs:
                kill_v2(job)
                n += 1
            for job in jobs:
                remove(job)
    elif kind == "v1":
        names = sorted({n for d in node_dirs for n in _listdir(d)
                        if os.path.isdir(os.path.join(d, n))})
        for name in names:
            kill_v1([os.path.join(d, name) for d in node_dirs])
            n += 1
        for name in names:
            for d in node_dirs:
                remove(os.path.join(d, name))
    for name in _listdir(pgroup_dir):
        if name.isdigit():
            try:
                os.killpg(int(name), signal.SIGKILL)
                n += 1
            except OSError:
                pass
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(pgroup_dir, name))
    return n


def reclaim(kind: str, node_dirs: list[str], spare: Callable[[int], bool]) -> int:
    """An agent starting after a crash that took its keeper too: kill and remove every job
    cgroup under the node's directories, except one holding a process ``spare`` names (a live
    agent's job). Returns how many held processes."""
    names = sorted({n for d in node_dirs for n in _listdir(d) if os.path.isdir(os.path.join(d, n))})
    killed = 0
    for name in names:
        dirs = [os.path.join(d, name) for d in node_dirs if os.path.isdir(os.path.join(d, name))]
        pids = {p for d in dirs for p in pids_in(d)}
        if any(spare(p) for p in pids):
            continue
        if pids:
            for d in dirs if kind == "v2" else ():
                kill_v2(d)
            if kind == "v1":
                kill_v1(dirs)
            killed += 1
        for d in dirs:
            remove(d)
    return killed


def _listdir(d: str) -> list[str]:
    try:
        return os.listdir(d)
    except OSError:
        return []


def main() -> None:
    """``argv``: the pipe's read fd, the kind (v2, v1 or none), the process-group directory,
    then the node's cgroup directories."""
    fd, kind, pgroup_dir, node_dirs = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4:]
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C to the agent's terminal is its own
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    while True:
        try:
            data = os.read(fd, 1)
        except InterruptedError:
            continue
        except OSError:
            data = b""
        if data == b"q":
            return
        if not data:  # the agent is gone
            n = kill_node(kind, node_dirs, pgroup_dir)
            sys.stderr.write(f"spillway keeper: agent gone; killed {n} job(s)\n")
            return


if __name__ == "__main__":
    main()
