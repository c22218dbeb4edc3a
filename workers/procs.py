"""Process helpers for the job runner: the parent-death wrapper, line splitting, leftovers.

A job process without a cgroup (or started while the agent's keeper is down; see
:meth:`workers.isolation.Isolation.kept`) is started as ``setpriv --pdeathsig KILL -- <argv>``
when util-linux ``setpriv`` is present, so the kernel SIGKILLs it if the agent dies without
cleaning up (kill -9, OOM); a job in a cgroup is killed by the keeper instead.
The parent-death signal fires when the *thread* that forked the child exits, not the process:
the :class:`~workers.runner.Supervisor` therefore forks every job from its own long-lived
thread, which lives exactly as long as the supervisor.

Grandchildren do not inherit the parent-death signal; a job's whole process group is SIGKILLed
when its main process exits, and an agent that restarts kills what an earlier incarnation left
behind by scanning ``/proc/*/environ`` for ``SPILLWAY_NODE_ID=<its node id>``.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import secrets
import shutil
import signal
import stat
import subprocess
import tempfile
import time
from collections.abc import Iterable, Mapping

from broker.model import Job
from workers.users import JobIdentity, blocked_at, own_dir

log = logging.getLogger(__name__)

MAX_LINE = 64 * 1024  # a longer line without a newline is cut into pieces of this size


@functools.lru_cache(maxsize=1)
def pdeathsig_prefix() -> tuple[str, ...]:
    """``(setpriv, --pdeathsig, KILL, --)`` when setpriv supports it, else ``()``. Resolved once."""
    path = shutil.which("setpriv")
    if path is None:
        log.warning("setpriv not found: jobs will not die with the agent if it is SIGKILLed "
                    "(install util-linux)")
        return ()
    try:
        out = subprocess.run([path, "--help"], capture_output=True, text=True, timeout=5,
                             check=False).stdout
    except (OSError, subprocess.SubprocessError):
        out = ""
    if "--pdeathsig" not in out:
        log.warning("%s has no --pdeathsig (util-linux < 2.33): jobs will not die with the "
                    "agent if it is SIGKILLed", path)
        return ()
    return (path, "--pdeathsig", "KILL", "--")


def make_undumpable() -> bool:
    """``prctl(PR_SET_DUMPABLE, 0)``: no process of another uid, nor of this one without
    CAP_SYS_PTRACE, may ptrace this one or read its ``/proc/<pid>/environ``, ``mem``, ``maps``
    or file descriptors, and it leaves no core dump (an agent's memory holds its Redis
    password). Children are not affected: ``execve`` makes them dumpable again. False where the
    call fails (not Linux), after a warning."""
    import ctypes

    pr_set_dumpable = 4
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(pr_set_dumpable, 0, 0, 0, 0) == 0:
            return True
        why = os.strerror(ctypes.get_errno())
    except (OSError, AttributeError) as e:
        why = str(e)
    log.warning("cannot make the agent non-dumpable (%s): a job running as the agent's uid "
                "could read the agent's memory and environment", why)
    return False


class LineSplitter:
    """Turns the bytes of one pipe into text lines (UTF-8, invalid bytes replaced)."""

    __slots__ = ("_rest",)

    def __init__(self) -> None:
        self._rest = b""

    def feed(self, data: bytes) -> list[str]:
        buf = self._rest + data if self._rest else data
        cut = buf.rfind(b"\n")
        if cut < 0:
            self._rest = buf
            return self._overlong()
        self._rest = buf[cut + 1:]
        lines = [_text(x) for x in buf[:cut].split(b"\n")]
        return lines + self._overlong()

    def _overlong(self) -> list[str]:
        out = []
        while len(self._rest) > MAX_LINE:
            out.append(_text(self._rest[:MAX_LINE]))
            self._rest = self._rest[MAX_LINE:]
        return out

    def close(self) -> list[str]:
        """The unterminated last line, if any."""
        rest, self._rest = self._rest, b""
        return [_text(rest)] if rest else []

    def drain(self, fd: int) -> list[str]:
        """The lines left in the non-blocking pipe ``fd`` (until its end, or until nothing
        more is written yet), the unterminated last one included: the pipe's last read."""
        lines = []
        while True:
            try:
                data = os.read(fd, 65536)
            except BlockingIOError:
                break
            if not data:
                break
            lines += self.feed(data)
        return lines + self.close()


def _text(raw: bytes) -> str:
    text = raw.decode("utf-8", "replace")
    return text[:-1] if text.endswith("\r") else text


_FOUND: dict[tuple[str, str], float] = {}  # (command, PATH) -> when it was last found
_FOUND_TTL_S = 5.0


def _found(command: str, path: str) -> bool:
    """``shutil.which(command, path=path)`` is not None; a command found is trusted for
    ``_FOUND_TTL_S`` (a search walks every PATH directory; a burst of jobs runs the same few
    commands). A command removed meanwhile fails at exec instead (StartFailed all the same)."""
    key = (command, path)
    now = time.monotonic()
    if now - _FOUND.get(key, -_FOUND_TTL_S) < _FOUND_TTL_S:
        return True
    if shutil.which(command, path=path) is None:
        _FOUND.pop(key, None)
        return False
    if len(_FOUND) > 1000:
        _FOUND.clear()
    _FOUND[key] = now
    return True


class StartError(Exception):
    """A job part cannot be started here (its workdir or command is missing)."""


def job_cwd(job: Job, node_id: str, work_dir: str, ident: JobIdentity | None = None
            ) -> tuple[str, str]:
    """The part's working directory, and a note for the job's log and history when it is not
    the job's workdir. The workdir (by default the directory the job was submitted from) where
    it exists on this node; otherwise, as Slurm does, somewhere else: a directory of the job's
    own, ``<work_dir>/jobs/<job>``, kept across its attempts, so that no two jobs share their
    relative outputs (with ``ident``, the job's user owns it, mode 0700). StartError if that
    cannot be made, or if ``ident`` could not enter the workdir."""
    spec = job.spec
    if spec.workdir:
        cwd = os.path.expanduser(spec.workdir)
        if os.path.isdir(cwd):
            if ident is not None and not can_enter(cwd, ident):
                raise StartError(
                    f"workdir {cwd} is not accessible to uid {ident.uid} ({ident.name}, the "
                    f"user team {job.team}'s jobs run as on node {node_id}): let that user "
                    "enter it, or name the team's own account in the agent's job_users")
            return cwd, ""
    own = os.path.join(work_dir, "jobs", job.id)
    try:
        _job_dir(own, ident)
    except OSError as e:
        raise StartError(f"cannot create the job's directory {own!r}: {e.strerror}") from None
    if not spec.workdir:  # (a record written by a client before workdirs were recorded)
        return own, ""
    return own, f"workdir {spec.workdir} does not exist on node {node_id}; running in {own} instead"


def _job_dir(path: str, ident: JobIdentity | None) -> None:
    """A directory of the job's: made (its parents traversable, not listable, by others) and,
    with ``ident``, its user's own, mode 0700."""
    if ident is None:
        os.makedirs(path, exist_ok=True)
        return
    parent = os.path.dirname(path)
    os.makedirs(parent, mode=0o711, exist_ok=True)
    own_dir(path, ident.uid, ident.gid)


def can_enter(path: str, ident: JobIdentity) -> bool:
    """Could ``ident`` (uid, gid, groups) enter the directory ``path``: the ``x`` permission
    on it and on every directory above it, by owner, group or others as Unix checks."""
    real = os.path.realpath(path)
    return os.path.isdir(real) and not blocked_at(real, ident.uid,
                                                 frozenset({ident.gid, *ident.groups}))


def job_launch(job: Job, rank: int, gpu_ids: tuple[str, ...], node_id: str,
               base_env: Mapping[str, str], work_dir: str, ident: JobIdentity | None = None
               ) -> tuple[list[str], str, dict[str, str], str]:
    """The argv, working directory and environment of one job part, and a note when the
    directory is not the job's workdir (:func:`job_cwd`); StartError if it cannot start. The
    environment is the agent's (less its secrets), the user's ``HOME``, ``USER`` and
    ``LOGNAME`` with ``ident``, then the job's own, then Spillway's variables, so
    ``CUDA_VISIBLE_DEVICES`` is always exactly the part's devices. Nothing here runs the
    environment: the process that gets it is already the job's user (workers/runner.py)."""
    spec = job.spec
    cwd, note = job_cwd(job, node_id, work_dir, ident)
    env = dict(base_env)
    if ident is not None:
        env.update(HOME=ident.home, USER=ident.name, LOGNAME=ident.name)
    env.update(spec.env)
    argv = list(spec.argv)
    if not _found(argv[0], env.get("PATH", os.defpath)) and not (
            "/" in argv[0] and os.access(os.path.join(cwd, argv[0]), os.X_OK)):
        raise StartError(f"command {argv[0]!r} not found or not executable on node {node_id}")
    ckpt = spec.checkpoint_dir or os.path.join(work_dir, "checkpoints", job.id)
    if not spec.checkpoint_dir:
        try:
            _job_dir(ckpt, ident)
        except OSError as e:
            raise StartError(f"cannot create checkpoint dir {ckpt!r}: {e.strerror}") from None
    visible = ",".join(gpu_ids)
    env.update({
        "CUDA_VISIBLE_DEVICES": visible,
        "NVIDIA_VISIBLE_DEVICES": visible,
        "SPILLWAY_JOB_ID": job.id,
        "SPILLWAY_ATTEMPT": str(job.attempt),
        "SPILLWAY_CHECKPOINT_DIR": ckpt,
        "SPILLWAY_NODE_ID": node_id,
        "SPILLWAY_NODE_RANK": str(rank),
        "SPILLWAY_NUM_NODES": str(spec.nodes),
    })
    if job.attempt > 1:
        env["SPILLWAY_RESUME"] = "1"
    else:
        env.pop("SPILLWAY_RESUME", None)
    return argv, cwd, env, note


def exit_code(returncode: int) -> int:
    """A shell-style exit code: a death by signal N is 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


# ---------------------------------------------------------------------------------------------
# Leftovers of an earlier incarnation


def _ancestors(pid: int) -> set[int]:
    out = set()
    while pid > 1 and pid not in out:
        out.add(pid)
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                stat = f.read()
            pid = int(stat[stat.rfind(b")") + 2:].split()[1])
        except (OSError, ValueError, IndexError):
            break
    return out


def _start_time(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        return stat[stat.rfind(b")") + 2:].split()[19].decode()
    except (OSError, IndexError):
        return None


def _registry() -> str:
    """The directory where this host's live agents are recorded (token -> pid and start time):
    ``/run/spillway/agents`` for root, else a directory of the user's in the temp directory;
    mode 0700, so a job learns nothing of its agent from it."""
    base = "/run/spillway/agents" if os.geteuid() == 0 and os.access("/run", os.W_OK) else \
        os.path.join(tempfile.gettempdir(), f"spillway-agents-{os.geteuid()}")
    os.makedirs(base, mode=0o700, exist_ok=True)
    st = os.lstat(base)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
        raise OSError(f"{base} is not a directory of uid {os.geteuid()}: refusing to use it")
    if st.st_mode & 0o077:
        os.chmod(base, 0o700)
    return base


def agent_tag(pid: int | None = None) -> str:
    """An opaque token naming an agent process, put in its jobs' ``SPILLWAY_AGENT`` (it tells
    a leftover from a live agent's job without handing the job its agent's pid). The agent's
    pid and start time are recorded under the token in :func:`_registry`; the token of this
    process is made once and stays the same."""
    pid = os.getpid() if pid is None else pid
    if pid == os.getpid() and _OWN_TAG:
        return _OWN_TAG[0]
    token = secrets.token_hex(12)
    path = os.path.join(_registry(), token)
    with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as f:
        f.write(f"{pid}:{_start_time(pid)}")
    if pid == os.getpid():
        _OWN_TAG.append(token)
    return token


_OWN_TAG: list[str] = []


def _live_agent(tag: str) -> bool:
    """Does the agent ``tag`` names still run? (A tag unknown here: no.)"""
    if not tag.isalnum():
        return False
    try:
        with open(os.path.join(_registry(), tag)) as f:
            pid, _, start = f.read().partition(":")
    except OSError:
        return False
    alive = pid.isdigit() and _start_time(int(pid)) == start
    if not alive:  # (a dead agent's record: forget it)
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(_registry(), tag))
    return alive


def of_live_agent(pid: int) -> bool:
    """Does ``pid`` carry (``SPILLWAY_AGENT``) the tag of an agent that still runs?"""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            env = f.read().split(b"\0")
    except OSError:
        return False
    tag = next((e[15:].decode() for e in env if e.startswith(b"SPILLWAY_AGENT=")), "")
    return bool(tag) and _live_agent(tag)


def find_leftovers(node_id: str, exclude: Iterable[int] = ()) -> list[int]:
    """Pids whose environment has ``SPILLWAY_NODE_ID=<node_id>`` and whose agent
    (``SPILLWAY_AGENT``) is gone, except this process, its ancestors and ``exclude``.

    A job of a *live* agent is never a leftover, even one with the same node id (two agents
    with one node id on a host is a mistake, but killing each other's jobs would make it
    worse); it is logged instead."""
    needle = b"SPILLWAY_NODE_ID=" + node_id.encode()
    me = agent_tag()
    skip = _ancestors(os.getpid()) | set(exclude)
    found, others = [], set()
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) in skip:
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                env = f.read().split(b"\0")
        except OSError:  # gone, or another user's process
            continue
        if needle not in env:
            continue
        tag = next((e[15:].decode() for e in env if e.startswith(b"SPILLWAY_AGENT=")), "")
        if tag and tag != me and _live_agent(tag):
            others.add(tag)
        elif tag != me:
            found.append(int(name))
    if others:
        log.warning("jobs with SPILLWAY_NODE_ID=%s belong to other live agent(s) %s: is a "
                    "second agent running with this node id?", node_id, ", ".join(sorted(others)))
    return sorted(found)


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return "?"


def kill_leftovers(node_id: str, exclude: Iterable[int] = ()) -> list[tuple[int, str]]:
    """SIGKILL every leftover job process of ``node_id``; return (pid, command line) of each."""
    killed = []
    for pid in find_leftovers(node_id, exclude):
        cmd = _cmdline(pid)
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            continue
        log.warning("killed leftover job process %d of node %s: %s", pid, node_id, cmd)
        killed.append((pid, cmd))
    return killed
