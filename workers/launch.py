"""How a job part's process is started: its argv, working directory, environment and user, its
cgroup and scratch directory (:meth:`Launcher.prepare`, on the caller's thread), and the fork
itself (:meth:`Launcher.fork`, on any thread; :class:`~workers.runner.Supervisor` then watches
the process).

A job runs as its team's user where the agent runs as root (:mod:`workers.users`): the one
program that runs as root is ``setpriv``, which switches user before running the job. A job
that must be moved into its cgroup by the agent waits at a gate (a shell reading one line on
stdin) until it is.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shlex
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from broker.errors import ConfigError
from broker.model import Job
from broker.security.redact import job_base_env
from workers import cgroupfs
from workers.parts import RunningPart
from workers.procs import StartError, agent_tag, job_launch, pdeathsig_prefix
from workers.users import JobIdentity, JobUsers, own_dir

if TYPE_CHECKING:
    from workers.isolation import Isolation

__all__ = ["Forked", "Launch", "Launcher", "root_unsafe"]

FORK_THREADS = 4  # a start batch's processes forked at once
#: a forked part: its process, and the read ends of its stdout and stderr
Forked = tuple[subprocess.Popen[bytes], int, int]

#: A gated part (:meth:`Launcher._open_gate`) waits for one line on stdin, then runs the job
#: with stdin from /dev/null; no line (the agent could not move it into its cgroup): exit 125.
_GATE = 'read -r _ || exit 125; exec "$@" </dev/null'
#: A job dropped by setpriv (:meth:`Launcher._dropped`) takes its environment, as its own
#: user, from the file ``$1`` (in its team's 0700 home), then runs the job; gated, it first
#: waits as above.
_SOURCE = '. "$1" || exit 125; shift; exec "$@"'
_SOURCE_GATED = 'read -r _ || exit 125; . "$1" || exit 125; shift; exec "$@" </dev/null'
_SHELL_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_SAFE_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"

#: What glibc removes from a set-user-id program's environment (sysdeps/generic/unsecvars.h),
#: and what a spec may not hand to ``setpriv`` running as root: the dynamic loader's, the C
#: library's (locale, time zone, resolver, iconv, malloc, tunables) and every ``LD_``.
_ROOT_UNSAFE = frozenset({
    "GCONV_PATH", "GETCONF_DIR", "GLIBC_TUNABLES", "HOSTALIASES", "LOCALDOMAIN", "LOCPATH",
    "MALLOC_TRACE", "NIS_PATH", "NLSPATH", "RESOLV_HOST_CONF", "RES_OPTIONS", "TMPDIR", "TZ",
    "TZDIR", "LANGUAGE", "LC_ALL", "LANG", "HOME", "PATH", "IFS", "ENV", "BASH_ENV"})


def root_unsafe(name: str) -> bool:
    """A variable a C library or dynamic loader would act on in a process of root's."""
    return name in _ROOT_UNSAFE or name.startswith(("LD_", "MALLOC_", "LC_", "GLIBC_"))


@dataclass
class Launch:
    """A part's process, ready to fork."""

    part: RunningPart
    argv: list[str]
    cwd: str
    env: dict[str, str]
    time_limit: float | None
    program: str = ""  # the job's own command (argv[0] after any wrappers), for errors
    ident: JobIdentity | None = None  # the user it runs as (None: the agent's)
    gated: bool = False  # waits on stdin until the agent has moved it into its cgroup
    future: Future[RunningPart] = field(default_factory=Future)


class Launcher:
    """Prepares and forks job parts' processes for one node's runner."""

    def __init__(self, jobs_dir: str, isolation: Isolation | None, users: JobUsers | None,
                 clock: Callable[[], float] = time.time) -> None:
        self.jobs_dir, self.isolation, self.users, self.clock = jobs_dir, isolation, users, clock
        # the agent's environment, read once, without its secrets (broker/security/redact.py)
        self._base_env = job_base_env(os.environ)
        self._prefix = list(pdeathsig_prefix())
        self._agent = agent_tag()
        self._setpriv = shutil.which("setpriv") or ""  # (jobs as their users, vfork-style)
        self._devnull = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
        self._fork_pool: ThreadPoolExecutor | None = None

    def close(self) -> None:
        if self._fork_pool is not None:
            self._fork_pool.shutdown(wait=False)

    def prepare(self, job: Job, part: RunningPart, node_id: str) -> Launch:
        """The launch of ``job``'s ``part`` on this node (the caller's thread): its argv
        (with any wrappers), working directory, environment and user; its cgroup and scratch
        directory made. StartError if it cannot start."""
        ident = self._identity(job)
        argv, cwd, env, part.note = job_launch(job, part.rank, part.gpu_ids, node_id,
                                               self._base_env, self.jobs_dir, ident)
        env["SPILLWAY_AGENT"] = self._agent  # tells a leftover from a live agent's job
        program = argv[0]
        gated = False
        if self.isolation is not None:
            try:
                part._box = self.isolation.box(job.id, job.attempt, part.rank,
                                               job.spec.memory_gb, job.spec.cpus,
                                               part.gpu_ids)  # the devices it may open
                if ident is not None:  # the job's user owns its scratch, and may reach it
                    os.chmod(os.path.dirname(part._box.scratch), 0o711)
                    own_dir(part._box.scratch, ident.uid, ident.gid)
            except OSError as e:
                raise StartError(f"cannot create the job's scratch directory: {e}") from None
            # A job's user cannot move itself into its cgroup (v2, or v1 where the forking
            # thread cannot enter): the agent moves it while it waits at a gate (fork)
            gated = ident is not None and bool(part._box.dirs) and not self.isolation.by_thread
            if not gated:
                argv = part._box.argv(argv)
            env.update(part._box.env())
        # No parent-death wrapper for a job in a cgroup that a live keeper will kill if the
        # agent dies (one exec less).
        kept = bool(part._box is not None and part._box.dirs and self.isolation is not None
                    and self.isolation.kept())
        direct = not any(root_unsafe(k) for k in job.spec.env)
        if ident is not None and self._setpriv and (direct or all(
                _SHELL_NAME.match(k) and "\n" not in v for k, v in env.items())):
            return self._dropped(part, job, ident, argv, cwd, env, kept, gated, program,
                                 direct)
        prefix = [] if kept else self._prefix
        argv = prefix + argv
        if gated:
            argv = ["/bin/sh", "-c", _GATE, "sh", *argv]
        return Launch(part, argv, cwd, env, job.spec.time_limit, program, ident, gated)

    def _dropped(self, part: RunningPart, job: Job, ident: JobIdentity, argv: list[str],
                 cwd: str, env: dict[str, str], kept: bool, gated: bool, program: str,
                 direct: bool) -> Launch:
        """A launch that switches to the job's user without forking the agent (a vfork,
        as for jobs as the agent's user): the one program that runs as root is ``setpriv``,
        which switches uid, gid and groups (and sets the parent-death signal), then runs the
        job. It gets the job's environment only where the spec sets none of the variables a
        C library or dynamic loader would act on in a root process (``direct``;
        :func:`root_unsafe`: the ones glibc drops for a set-user-id program, and the like);
        otherwise it gets ``PATH``
        alone and runs ``/bin/sh`` as the job's user, which reads the job's environment from
        a file of the user's (0600, in its team's home) and runs the job. Nothing of the
        spec that could act in a process of root's reaches one."""
        groups = ["--groups", ",".join(map(str, ident.groups))] if ident.groups else \
            ["--clear-groups"]
        drop = [self._setpriv, "--reuid", str(ident.uid), "--regid", str(ident.gid), *groups,
                *([] if kept else ["--pdeathsig", "KILL"]), "--"]
        if direct:  # (the usual job: setpriv may have its environment, as a set-user-id
            if gated:  # program would)
                argv = ["/bin/sh", "-c", _GATE, "sh", *argv]
            return Launch(part, [*drop, *argv], cwd, env, job.spec.time_limit, program,
                           None, gated)
        name = f".spillway-env-{secrets.token_hex(8)}"
        path = os.path.join(ident.home, name)
        text = "".join(f"export {k}={shlex.quote(v)}\n" for k, v in env.items())
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            try:
                os.write(fd, text.encode())
                os.fchown(fd, ident.uid, ident.gid)
            finally:
                os.close(fd)
        except OSError as e:
            raise StartError(f"cannot write the job's environment for its user: {e}") from None
        part._env_file = path
        script = _SOURCE_GATED if gated else _SOURCE
        argv = [*drop, "/bin/sh", "-c", script, "sh", path, *argv]
        return Launch(part, argv, cwd, {"PATH": _SAFE_PATH}, job.spec.time_limit, program,
                       None, gated)

    def _identity(self, job: Job) -> JobIdentity | None:
        """The user ``job`` runs as (None: the agent's); StartError if it has none."""
        if self.users is None:
            return None
        try:
            return self.users.for_team(job.team)
        except (ConfigError, OSError) as e:
            raise StartError(f"no user for team {job.team!r} on this node: {e}") from None

    def fork_many(self, launches: list[Launch]) -> list[Forked | BaseException]:
        """Fork the launches' processes, several at once (each fork waits until its child has
        exec'd, which on a busy host means waiting for a core: one after another, a batch
        waited that long per part): each one's :meth:`fork`, or the OSError or ValueError
        it raised."""
        if len(launches) > 1:
            return list(self._forker().map(_capture(self.fork), launches))
        return [_capture(self.fork)(launch) for launch in launches]

    def _forker(self) -> ThreadPoolExecutor:
        """The threads that fork a batch's processes (made on first use)."""
        if self._fork_pool is None:
            self._fork_pool = ThreadPoolExecutor(FORK_THREADS, "spillway-fork")
        return self._fork_pool

    def fork(self, launch: Launch) -> Forked:
        """Start the part's process (any thread): the process and its output's read ends."""
        part = launch.part
        out_r, out_w = os.pipe2(os.O_CLOEXEC)
        err_r, err_w = os.pipe2(os.O_CLOEXEC)
        gate_r, gate_w = os.pipe2(os.O_CLOEXEC) if launch.gated else (self._devnull, -1)
        ident = launch.ident
        # As the job's user from the fork on: the child switches uid, gid and groups before
        # it executes anything, so nothing of the spec (its env: LD_PRELOAD, PATH...) ever
        # reaches a privileged process
        who: dict[str, Any] = {} if ident is None else {
            "user": ident.uid, "group": ident.gid, "extra_groups": list(ident.groups)}
        try:  # v1: this thread enters the part's cgroups while it forks (JobBox.entering)
            with part._box.entering() if part._box is not None else contextlib.nullcontext():
                proc = subprocess.Popen(launch.argv, cwd=launch.cwd, env=launch.env,
                                        stdin=gate_r, stdout=out_w, stderr=err_w,
                                        start_new_session=True, **who)
        except BaseException:
            for fd in (out_r, err_r):
                os.close(fd)
            if launch.gated:
                os.close(gate_w)
            raise
        finally:
            os.close(out_w)
            os.close(err_w)
            if launch.gated:
                os.close(gate_r)
        if launch.gated:
            try:
                self._open_gate(part, proc, gate_w)
            except OSError:
                for fd in (out_r, err_r):
                    os.close(fd)
                raise
        part.started_at = self.clock()
        return proc, out_r, err_r

    @staticmethod
    def _open_gate(part: RunningPart, proc: subprocess.Popen[bytes], gate_w: int) -> None:
        """Move a gated part's process into its cgroup, then let it go on to the job; if it
        cannot be moved, it is killed (it never runs outside its cgroup) and OSError says
        why."""
        try:
            assert part._box is not None
            for d in part._box.dirs:
                cgroupfs.write(os.path.join(d, "cgroup.procs"), str(proc.pid))
            os.write(gate_w, b"go\n")
        except OSError:
            with contextlib.suppress(OSError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise
        finally:
            os.close(gate_w)


def _capture(fn: Callable[[Launch], Forked]) -> Callable[[Launch], Forked | BaseException]:
    def call(launch: Launch) -> Forked | BaseException:
        try:
            return fn(launch)
        except (OSError, ValueError) as e:
            return e
    return call
