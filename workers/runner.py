"""The job runner: job processes as children of the agent, watched from one thread.

Threads:

* the **supervisor thread** owns every job process. It forks them (so their parent-death
  signal is tied to a thread that lives as long as the supervisor; see :mod:`workers.procs`),
  waits in one ``selectors`` loop on their stdout/stderr pipes and their ``pidfd`` (exit), and
  on a tick enforces time limits and SIGTERM -> SIGKILL grace deadlines. Other threads talk to
  it through a command queue and a wake-up pipe; it never touches the network.
* the **reporter thread** does the slow I/O in order: log batches to the store and to
  ``<work_dir>/logs/<job>.<attempt>.log``, then the ``on_exit`` callback of a finished part.
  A part's last log batch is always written before its ``on_exit`` runs. It takes what is
  queued in batches: with ``on_exits``, the parts that ended meanwhile are handed over
  together (one call, so their owner can report them in one round trip).

:meth:`Supervisor.spawn` may be called from any thread; the fork happens on the supervisor
thread and the caller waits for it.
"""

from __future__ import annotations

import collections
import contextlib
import heapq
import itertools
import logging
import math
import os
import queue
import re
import secrets
import selectors
import shlex
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from broker.errors import ConfigError, JobNotFound, StaleAttempt
from broker.model import Job
from broker.model.values import MAX_TIME_LIMIT_S, seconds_text
from broker.security.redact import job_base_env
from broker.store.events import STOPPED, JobEvent, StartFailed
from workers import cgroupfs
from workers.procs import (
    LineSplitter,
    StartError,
    agent_tag,
    exit_code,
    job_launch,
    pdeathsig_prefix,
)
from workers.users import JobIdentity, JobUsers, own_dir

if TYPE_CHECKING:
    from workers.isolation import Isolation

log = logging.getLogger(__name__)

Key = tuple[str, int, int]  # (job id, attempt, rank)
_POLL_S = 0.05  # exit polling period where pidfd_open is missing
# The longest one select() waits: a timer further off is looked at again when it wakes. epoll
# takes its timeout as milliseconds in a C int: past about 24.8 days it raises OverflowError
# (inf and 1e300 too), which once left the loop failing at once, forever, its jobs unwatched.
_MAX_WAIT_S = 3600.0
_REPORT_BATCH = 256  # reporter items taken at once
_FORK_THREADS = 4  # a start batch's processes forked at once
#: A gated part (:meth:`Supervisor._open_gate`) waits for one line on stdin, then runs the job
#: with stdin from /dev/null; no line (the agent could not move it into its cgroup): exit 125.
_GATE = 'read -r _ || exit 125; exec "$@" </dev/null'
#: A job dropped by setpriv (:meth:`Supervisor._dropped`) takes its environment, as its own
#: user, from the file ``$1`` (in its team's 0700 home), then runs the job; gated, it first
#: waits as above.
_SOURCE = '. "$1" || exit 125; shift; exec "$@"'
_SOURCE_GATED = 'read -r _ || exit 125; . "$1" || exit 125; shift; exec "$@" </dev/null'
_SHELL_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_SAFE_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"


def time_limit_for(value: object, most: float) -> tuple[float | None, str]:
    """The time limit a part runs under, and why it is not the one its record gives ("" when
    it is). Submit takes only limits > 0, finite and at most the maximum, but a record
    written by an older client may hold anything: a longer one is held to ``most``, and one
    that is no positive finite number (NaN, inf, 0, negative, not a number) runs under
    ``most`` too, so no value can leave a part without a bounded timer. None: no limit."""
    if value is None:
        return None, ""
    try:
        secs = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        secs = math.nan
    if 0 < secs <= most:
        return secs, ""
    if math.isfinite(secs) and secs > most:
        return most, (f"time_limit {seconds_text(secs)} is longer than this node's maximum; "
                      f"held to {seconds_text(most)}")
    return most, (f"time_limit {value!r} is not a positive finite number of seconds; held to "
                  f"the maximum, {seconds_text(most)}")


@dataclass(eq=False)
class RunningPart:
    """One rank of one attempt of a job on this node, while it runs and after it ended."""

    job_id: str
    attempt: int
    rank: int
    gpu_ids: tuple[str, ...]
    pid: int | None = None
    started_at: float = 0.0
    exit_code: int | None = None  # shell style: 128 + N after signal N
    reason: str = ""  # Exited, Signal, Stopped, TimeLimit, StaleAttempt, or the stop reason
    start_error: str | None = None  # set when the process could not be started
    job_after: Job | None = None  # the store's job after a StartFailed report
    done: threading.Event = field(default_factory=threading.Event)
    # set by the part's owner once its start is reported (the agent reports the end after it)
    start_reported: threading.Event = field(default_factory=threading.Event)
    # set by the owner when it reported the end itself, with the start (its on_exit skips it)
    end_reported: bool = False
    output: bool = False  # the part wrote a line (set before exit_code)
    note: str = ""  # why it runs elsewhere than its workdir (in its log, and its start report)
    # supervisor-thread state
    _proc: subprocess.Popen[bytes] | None = None
    _pidfd: int = -1
    _pipes: dict[int, tuple[str, LineSplitter]] = field(default_factory=dict)
    _buf: list[tuple[str, str]] = field(default_factory=list)
    _stop_reason: str | None = None
    _kill_at: float | None = None
    _logfile: Any = None
    _stale: bool = False
    _box: Any = None  # its workers.isolation.JobBox: cgroup and scratch directory
    _env_file: str = ""  # the environment file of a job run through setpriv (removed at end)

    @property
    def settled(self) -> bool:
        """Ended without writing a line and holds no cgroup or scratch directory: nothing is
        left to do before its end is reported."""
        return self.exit_code is not None and not self.output and (
            self._box is None or self._box.released)

    def settle(self) -> bool:
        """:attr:`settled`, after releasing the cgroup and scratch directory of a part that
        ended without writing a line (any thread: the release is done once, by whichever
        thread comes first; the reporter's :meth:`Supervisor._ended` then finds it done)."""
        if self.exit_code is None or self.output:
            return False
        if self._box is not None and not self._box.released:
            try:
                self._box.release()
            except Exception:
                log.exception("job %s: releasing its cgroup and scratch failed", self.job_id)
                return False
        return self.settled

    @property
    def key(self) -> Key:
        return (self.job_id, self.attempt, self.rank)

    @property
    def owner(self) -> str:
        return f"{self.job_id}:{self.attempt}"


class PartStore(Protocol):
    """Where the runner reports a part that failed to start and writes its log lines: the
    agent's channel (workers/channel.py), or a store object (tests)."""

    def report(self, job_id: str, attempt: int, event: JobEvent, now: float) -> Job | None:
        ...

    def append_logs(self, job_id: str, attempt: int, lines: Sequence[tuple[str, str]],
                    now: float) -> None: ...


#: What glibc removes from a set-user-id program's environment (sysdeps/generic/unsecvars.h),
#: and what a spec may not hand to ``setpriv`` running as root: the dynamic loader's, the C
#: library's (locale, time zone, resolver, iconv, malloc, tunables) and every ``LD_``.
_ROOT_UNSAFE = frozenset({
    "GCONV_PATH", "GETCONF_DIR", "GLIBC_TUNABLES", "HOSTALIASES", "LOCALDOMAIN", "LOCPATH",
    "MALLOC_TRACE", "NIS_PATH", "NLSPATH", "RESOLV_HOST_CONF", "RES_OPTIONS", "TMPDIR", "TZ",
    "TZDIR", "LANGUAGE", "LC_ALL", "LANG", "HOME", "PATH", "IFS", "ENV", "BASH_ENV"})


def _root_unsafe(name: str) -> bool:
    return name in _ROOT_UNSAFE or name.startswith(("LD_", "MALLOC_", "LC_", "GLIBC_"))


def _drop_env_file(part: RunningPart) -> None:
    if part._env_file:
        with contextlib.suppress(OSError):
            os.unlink(part._env_file)
        part._env_file = ""


@dataclass
class _Launch:
    part: RunningPart
    argv: list[str]
    cwd: str
    env: dict[str, str]
    time_limit: float | None
    program: str = ""  # the job's own command (argv[0] after any wrappers), for errors
    ident: JobIdentity | None = None  # the user it runs as (None: the agent's)
    gated: bool = False  # waits on stdin until the agent has moved it into its cgroup
    future: Future[RunningPart] = field(default_factory=Future)


class Supervisor:
    """Runs job parts; ``on_exit(part)`` is called (on the reporter thread) when one ends, or
    ``on_exits(parts)`` once for the parts that ended together."""

    #: the longest time limit a part runs under, whatever its record says (time_limit_for);
    #: the agent sets the configuration's max_time_limit_s
    max_time_limit_s: float = MAX_TIME_LIMIT_S

    def __init__(self, store: PartStore, work_dir: str, on_exit: Callable[[RunningPart], None]
                 | None = None, grace_s: float = 30.0, flush_s: float = 0.1,
                 flush_lines: int = 500, clock: Callable[[], float] = time.time,
                 isolation: Isolation | None = None,
                 on_exits: Callable[[list[RunningPart]], None] | None = None,
                 job_user: str = "", users: JobUsers | None = None,
                 jobs_dir: str | None = None) -> None:
        self.isolation = isolation  # None: no cgroups nor scratch directories (as before)
        self.store, self.on_exit, self.grace_s = store, on_exit, grace_s
        self.on_exits = on_exits
        self.flush_s, self.flush_lines, self.clock = flush_s, flush_lines, clock
        self.work_dir = os.path.abspath(os.path.expanduser(work_dir))
        self.log_dir = os.path.join(self.work_dir, "logs")
        os.makedirs(self.log_dir, exist_ok=True)
        # jobs' own directories (working directory, checkpoints): under work_dir, unless
        # jobs could not reach it (workers/users.py jobs_dir)
        self.jobs_dir = os.path.abspath(os.path.expanduser(jobs_dir or work_dir))
        # the agent's environment, read once, without its secrets (broker/security/redact.py)
        self._base_env = job_base_env(os.environ)
        self._prefix = list(pdeathsig_prefix())
        # which user each team's jobs run as (an agent as root; workers/users.py); None: the
        # agent's own. ``job_user`` alone: every team as that one user
        self.users = users if users is not None or not job_user else \
            JobUsers(self.jobs_dir, shared=job_user)
        if self.users is not None:
            os.makedirs(self.jobs_dir, exist_ok=True)
            os.chmod(self.jobs_dir, 0o711)  # jobs pass through to their directories, no more
            os.chmod(self.log_dir, 0o700)
        self._agent = agent_tag()
        self._setpriv = shutil.which("setpriv") or ""  # (jobs as their users, vfork-style)
        self._lock = threading.Lock()
        self._parts: dict[Key, RunningPart] = {}  # written by the supervisor thread only
        self._cmds: collections.deque[tuple[Any, ...]] = collections.deque()
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._devnull = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
        self._sel = selectors.DefaultSelector()
        self._sel.register(self._wake_r, selectors.EVENT_READ, None)
        self._timers: list[tuple[float, int, str, RunningPart]] = []
        self._seq = itertools.count()
        self._dirty: dict[Key, float] = {}  # parts with buffered lines -> first line time
        self._polled: set[RunningPart] = set()  # parts without a pidfd
        # a log write to run, a part that ended (its on_exit), or None (quit)
        self._reports: queue.SimpleQueue[Callable[[], None] | RunningPart | None] = \
            queue.SimpleQueue()
        self._pending_reports = 0
        self._idle = threading.Condition(self._lock)
        self._closing = False
        self._fork_pool: ThreadPoolExecutor | None = None
        self._thread = threading.Thread(target=self._loop, name="spillway-supervisor",
                                        daemon=True)
        self._reporter = threading.Thread(target=self._report_loop, name="spillway-reporter",
                                          daemon=True)
        self._thread.start()
        self._reporter.start()

    # -- public API (any thread) ---------------------------------------------------------------

    def spawn(self, job: Job, rank: int, gpu_ids: tuple[str, ...], node_id: str) -> RunningPart:
        """Start ``job``'s part ``rank`` with exactly ``gpu_ids`` visible. A part that cannot
        start (missing workdir or command) is reported StartFailed and returned with
        ``start_error`` set; nothing is raised."""
        return self.spawn_many([(job, rank, gpu_ids)], node_id)[0]

    def spawn_many(self, items: list[tuple[Job, int, tuple[str, ...]]], node_id: str
                   ) -> list[RunningPart]:
        launches: list[_Launch] = []
        out: list[RunningPart] = []
        for job, rank, gpu_ids in items:
            part = RunningPart(job.id, job.attempt, rank, tuple(gpu_ids))
            out.append(part)
            try:
                launches.append(self._prepare(job, part, node_id))
            except StartError as e:
                self._start_failed(part, str(e))
        if launches and threading.current_thread() is self._thread:
            self._do_spawn(launches)  # called from an on-loop callback: no hand-off
        elif launches:
            self._command(("spawn", launches))
            for launch in launches:
                try:
                    launch.future.result()
                except (OSError, ValueError) as e:
                    why = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
                    self._start_failed(launch.part,
                                       f"cannot start {launch.program!r}: {why}")
        return out

    def stop(self, job_id: str, attempt: int, grace_s: float, reason: str = STOPPED) -> bool:
        """SIGTERM the job's process groups now, SIGKILL after ``grace_s``. False if none runs."""
        if not self.find(job_id, attempt):
            return False
        self._command(("stop", job_id, attempt, max(0.0, grace_s), reason))
        return True

    def kill(self, job_id: str, attempt: int, reason: str = "Killed") -> bool:
        return self.stop(job_id, attempt, 0.0, reason)

    def kill_all(self, reason: str = "AgentStopped") -> None:
        """SIGKILL every job now. Takes no lock: safe in a signal handler."""
        self._command(("kill_all", reason))

    def find(self, job_id: str, attempt: int) -> list[RunningPart]:
        with self._lock:
            return [p for p in self._parts.values()
                    if p.job_id == job_id and p.attempt == attempt]

    def parts(self) -> list[RunningPart]:
        with self._lock:
            return list(self._parts.values())

    def pids(self) -> set[int]:
        with self._lock:
            return {p.pid for p in self._parts.values() if p.pid}

    def wait_idle(self, timeout: float) -> bool:
        """Wait until no part runs and every report (logs, on_exit) is done."""
        with self._idle:
            return self._idle.wait_for(lambda: not self._parts and not self._pending_reports,
                                       timeout)

    def close(self, timeout: float = 10.0) -> None:
        """SIGKILL every job process group, wait for their reports, stop the threads."""
        self._closing = True
        self.kill_all()
        self.wait_idle(timeout)
        self._command(("quit",))
        self._thread.join(timeout)
        if self._fork_pool is not None:
            self._fork_pool.shutdown(wait=False)
        self._reports.put(None)
        self._reporter.join(timeout)

    # -- preparing a start (caller's thread) ---------------------------------------------------

    def _prepare(self, job: Job, part: RunningPart, node_id: str) -> _Launch:
        if self._closing:
            raise StartError("the agent is shutting down")
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
            # thread cannot enter): the agent moves it while it waits at a gate (_fork)
            gated = ident is not None and bool(part._box.dirs) and not self.isolation.by_thread
            if not gated:
                argv = part._box.argv(argv)
            env.update(part._box.env())
        # No parent-death wrapper for a job in a cgroup that a live keeper will kill if the
        # agent dies (one exec less).
        kept = bool(part._box is not None and part._box.dirs and self.isolation is not None
                    and self.isolation.kept())
        direct = not any(_root_unsafe(k) for k in job.spec.env)
        if ident is not None and self._setpriv and (direct or all(
                _SHELL_NAME.match(k) and "\n" not in v for k, v in env.items())):
            return self._dropped(part, job, ident, argv, cwd, env, kept, gated, program,
                                 direct)
        prefix = [] if kept else self._prefix
        argv = prefix + argv
        if gated:
            argv = ["/bin/sh", "-c", _GATE, "sh", *argv]
        return _Launch(part, argv, cwd, env, job.spec.time_limit, program, ident, gated)

    def _dropped(self, part: RunningPart, job: Job, ident: JobIdentity, argv: list[str],
                 cwd: str, env: dict[str, str], kept: bool, gated: bool, program: str,
                 direct: bool) -> _Launch:
        """A launch that switches to the job's user without forking the agent (a vfork,
        as for jobs as the agent's user): the one program that runs as root is ``setpriv``,
        which switches uid, gid and groups (and sets the parent-death signal), then runs the
        job. It gets the job's environment only where the spec sets none of the variables a
        C library or dynamic loader would act on in a root process (``direct``;
        :func:`_root_unsafe`: the ones glibc drops for a set-user-id program, and the like);
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
            return _Launch(part, [*drop, *argv], cwd, env, job.spec.time_limit, program,
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
        return _Launch(part, argv, cwd, {"PATH": _SAFE_PATH}, job.spec.time_limit, program,
                       None, gated)

    def _identity(self, job: Job) -> JobIdentity | None:
        """The user ``job`` runs as (None: the agent's); StartError if it has none."""
        if self.users is None:
            return None
        try:
            return self.users.for_team(job.team)
        except (ConfigError, OSError) as e:
            raise StartError(f"no user for team {job.team!r} on this node: {e}") from None

    def _start_failed(self, part: RunningPart, message: str) -> None:
        _drop_env_file(part)
        part.start_error, part.exit_code, part.reason = message, 127, "StartFailed"
        log.warning("job %s attempt %d rank %d: start failed: %s", part.job_id, part.attempt,
                    part.rank, message)
        try:
            part.job_after = self.store.report(part.job_id, part.attempt,
                                               StartFailed(part.rank, message), self.clock())
        except (StaleAttempt, JobNotFound) as e:
            log.info("start failure of a stale attempt dropped: %s", e)
        part.done.set()

    # -- supervisor thread -------------------------------------------------------------------

    def _command(self, cmd: tuple[Any, ...]) -> None:
        self._cmds.append(cmd)
        with contextlib.suppress(BlockingIOError):  # full: the loop is awake anyway
            os.write(self._wake_w, b"x")

    def _loop(self) -> None:
        while True:
            try:
                if self._step():
                    return
            except Exception:  # never let the thread die: its children would (pdeathsig)
                log.exception("job supervisor error (continuing)")

    def _step(self) -> bool:
        """One round: events, commands, timers. True when asked to quit."""
        for key, _ in self._sel.select(self._timeout()):
            if key.data is None:
                with contextlib.suppress(BlockingIOError):
                    os.read(self._wake_r, 4096)
            elif key.data[0] == "exit":
                self._finish(key.data[1])
            else:
                self._read(key.data[1], key.fd)
        while self._cmds:
            cmd = self._cmds.popleft()
            if cmd[0] == "quit":
                return True
            getattr(self, "_do_" + cmd[0])(*cmd[1:])
        self._tick()
        return False

    def _timeout(self) -> float | None:
        """How long select() may wait: until the next timer, flush or poll, at most
        :data:`_MAX_WAIT_S` (never a timeout epoll cannot take; a NaN never spins)."""
        if self._cmds:
            return 0
        when = [self._timers[0][0]] if self._timers else []
        if self._dirty:
            when.append(next(iter(self._dirty.values())) + self.flush_s)
        if self._polled:
            when.append(time.monotonic() + _POLL_S)
        if not when:
            return None
        wait = min(when) - time.monotonic()
        return min(max(0.0, wait), _MAX_WAIT_S) if not math.isnan(wait) else _MAX_WAIT_S

    def _do_spawn(self, launches: list[_Launch]) -> None:
        """Fork the launches' processes, several at once (each fork waits until its child has
        exec'd, which on a busy host means waiting for a core: one after another, a batch
        waited that long per part), then watch them from this thread, in order."""
        if len(launches) > 1:
            forks = list(self._forker().map(self._capture(self._fork), launches))
        else:
            forks = [self._capture(self._fork)(launch) for launch in launches]
        for launch, forked in zip(launches, forks):
            if isinstance(forked, BaseException):  # OSError; ValueError: a NUL in argv or env
                launch.future.set_exception(forked)
            else:
                launch.future.set_result(self._watch(launch, *forked))

    @staticmethod
    def _capture(fn: Callable[[_Launch], Any]) -> Callable[[_Launch], Any]:
        def call(launch: _Launch) -> Any:
            try:
                return fn(launch)
            except (OSError, ValueError) as e:
                return e
        return call

    def _forker(self) -> ThreadPoolExecutor:
        """The threads that fork a batch's processes (made on first use)."""
        if self._fork_pool is None:
            self._fork_pool = ThreadPoolExecutor(_FORK_THREADS, "spillway-fork")
        return self._fork_pool

    def _fork(self, launch: _Launch) -> tuple[subprocess.Popen[bytes], int, int]:
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

    def _watch(self, launch: _Launch, proc: subprocess.Popen[bytes], out_r: int, err_r: int
               ) -> RunningPart:
        """Watch a started part's exit, output and time limit (the supervisor thread)."""
        part = launch.part
        part._proc, part.pid = proc, proc.pid
        if part._box is not None:
            part._box.started(proc.pid)
        try:
            part._pidfd = os.pidfd_open(proc.pid)
            self._sel.register(part._pidfd, selectors.EVENT_READ, ("exit", part))
        except OSError:  # a kernel before 5.3: poll for the exit on the tick instead
            self._polled.add(part)
        for fd, stream in ((out_r, "out"), (err_r, "err")):
            os.set_blocking(fd, False)
            part._pipes[fd] = (stream, LineSplitter())
            self._sel.register(fd, selectors.EVENT_READ, ("read", part))
        limit, why = time_limit_for(launch.time_limit, self.max_time_limit_s)
        if limit is not None:
            self._timer(time.monotonic() + limit, "limit", part)
        with self._lock:
            self._parts[part.key] = part
        if part.note:  # first in its log
            self._add_lines(part, "err", ["spillway: " + part.note])
        if why:
            log.warning("job %s attempt %d: %s", part.job_id, part.attempt, why)
            self._add_lines(part, "err", ["spillway: " + why])
        return part

    def _timer(self, when: float, kind: str, part: RunningPart) -> None:
        if math.isnan(when):  # (a NaN would break the heap's earliest-first order)
            when = math.inf
        heapq.heappush(self._timers, (when, next(self._seq), kind, part))

    def _do_stop(self, job_id: str, attempt: int, grace_s: float, reason: str) -> None:
        for part in self.find(job_id, attempt):
            self._signal_stop(part, grace_s, reason)

    def _do_kill_all(self, reason: str) -> None:
        for part in self.parts():
            self._signal_stop(part, 0.0, reason)

    def _signal_stop(self, part: RunningPart, grace_s: float, reason: str) -> None:
        if part.exit_code is not None:
            return
        if part._stop_reason is None:
            part._stop_reason = reason
        if not grace_s >= 0:  # NaN or negative: no grace
            grace_s = 0.0
        kill_at = time.monotonic() + grace_s
        if grace_s <= 0:
            self._killpg(part, signal.SIGKILL)
            return
        if part._kill_at is None:
            self._killpg(part, signal.SIGTERM)
        if part._kill_at is None or kill_at < part._kill_at:
            part._kill_at = kill_at
            self._timer(kill_at, "kill", part)

    @staticmethod
    def _killpg(part: RunningPart, sig: int) -> None:
        if part.pid is None or part.exit_code is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(part.pid, sig)  # the group id is the pid: start_new_session
        if sig == signal.SIGKILL and part._box is not None:
            part._box.kill()  # its whole cgroup, processes that left the group included

    def _tick(self) -> None:
        for part in list(self._polled):
            assert part.pid is not None  # exited yet? WNOWAIT: leave it to _finish to reap
            if os.waitid(os.P_PID, part.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT):
                self._finish(part)
        now = time.monotonic()
        while self._timers and self._timers[0][0] <= now:
            _, _, kind, part = heapq.heappop(self._timers)
            if part.exit_code is not None:
                continue
            if kind == "limit":
                self._signal_stop(part, self.grace_s, "TimeLimit")
            elif part._kill_at is not None and part._kill_at <= now:
                self._killpg(part, signal.SIGKILL)
        while self._dirty:
            key, since = next(iter(self._dirty.items()))
            if since + self.flush_s > now:
                break
            self._flush(self._parts[key])

    def _read(self, part: RunningPart, fd: int) -> None:
        if fd not in part._pipes:
            return  # closed earlier in this batch of events
        try:
            data = os.read(fd, 65536)
        except BlockingIOError:
            return
        stream, splitter = part._pipes[fd]
        if not data:
            self._close_pipe(part, fd)
            lines = splitter.close()
        else:
            lines = splitter.feed(data)
        if lines:
            self._add_lines(part, stream, lines)

    def _add_lines(self, part: RunningPart, stream: str, lines: list[str]) -> None:
        part.output = True
        if not part._buf:
            self._dirty[part.key] = time.monotonic()
        part._buf += [(stream, line) for line in lines]
        if len(part._buf) >= self.flush_lines:
            self._flush(part)

    def _close_pipe(self, part: RunningPart, fd: int) -> None:
        part._pipes.pop(fd, None)
        self._sel.unregister(fd)
        os.close(fd)

    def _flush(self, part: RunningPart) -> None:
        self._dirty.pop(part.key, None)
        if part._buf:
            lines, part._buf = part._buf, []
            self._report(lambda: self._write_logs(part, lines))

    def _finish(self, part: RunningPart) -> None:
        """The main process exited: kill its group, reap, collect its last output, report."""
        if part._pidfd >= 0:
            self._sel.unregister(part._pidfd)
            os.close(part._pidfd)
            part._pidfd = -1
        self._polled.discard(part)
        self._killpg(part, signal.SIGKILL)  # not reaped yet: the group id cannot be reused
        assert part._proc is not None
        returncode = part._proc.wait()
        code = exit_code(returncode)
        for fd, (stream, splitter) in list(part._pipes.items()):
            lines = []
            while True:
                try:
                    data = os.read(fd, 65536)
                except BlockingIOError:
                    break
                if not data:
                    break
                lines += splitter.feed(data)
            lines += splitter.close()
            if lines:
                self._add_lines(part, stream, lines)
            self._close_pipe(part, fd)
        if part._stop_reason == "TimeLimit" and code == 0:
            code = 124  # a time limit never ends as success
        part.reason = part._stop_reason or ("Signal" if returncode < 0 else "Exited")
        if part._box is not None:
            part.reason = part._box.end_reason(part.reason, returncode)
        part.exit_code, part._proc = code, None  # last: other threads read reason after it
        self._flush(part)
        self._report(part, remove=part.key)

    # -- reporter thread -----------------------------------------------------------------------

    def _report(self, item: Callable[[], None] | RunningPart, remove: Key | None = None
                ) -> None:
        with self._lock:  # one step, so wait_idle never sees the part gone and no report due
            if remove is not None:
                del self._parts[remove]
            self._pending_reports += 1
        self._reports.put(item)

    def _report_loop(self) -> None:
        while True:
            batch = [self._reports.get()]
            while len(batch) < _REPORT_BATCH:
                try:
                    batch.append(self._reports.get_nowait())
                except queue.Empty:
                    break
            ended: list[RunningPart] = []
            quit_ = False
            for item in batch:
                if item is None:
                    quit_ = True
                    break
                if isinstance(item, RunningPart):
                    ended.append(item)  # after the log writes queued with it
                    continue
                try:
                    item()
                except Exception:
                    log.exception("job runner report failed")
            if ended:
                self._ended(ended)
            with self._idle:
                self._pending_reports -= len(batch) - quit_
                if not self._pending_reports:
                    self._idle.notify_all()
            if quit_:
                return

    def _write_logs(self, part: RunningPart, lines: list[tuple[str, str]]) -> None:
        if part._logfile is None:
            path = os.path.join(self.log_dir, f"{part.job_id}.{part.attempt}.log")
            part._logfile = open(path, "a", encoding="utf-8", errors="replace")  # noqa: SIM115
        part._logfile.write("".join(f"{s} {t}\n" for s, t in lines))
        part._logfile.flush()
        if part._stale:
            return
        try:
            self.store.append_logs(part.job_id, part.attempt, lines, self.clock())
        except (StaleAttempt, JobNotFound) as e:
            part._stale = True
            log.warning("%s; killing its processes", e)
            self.kill(part.job_id, part.attempt, "StaleAttempt")
        except Exception as e:
            log.warning("job %s: %d log lines not stored (%s); they are in %s", part.job_id,
                        len(lines), e, part._logfile.name)

    def _ended(self, parts: list[RunningPart]) -> None:
        for part in parts:
            _drop_env_file(part)
            try:
                if part._box is not None:
                    part._box.release()  # no process of the part is left when its end is reported
            except Exception:
                log.exception("job %s: releasing its cgroup and scratch failed", part.job_id)
            if part._logfile is not None:
                part._logfile.close()
                part._logfile = None
        try:
            if self.on_exits is not None:
                self.on_exits(parts)
            elif self.on_exit is not None:
                for part in parts:
                    try:
                        self.on_exit(part)
                    except Exception:
                        log.exception("job runner report failed")
        except Exception:
            log.exception("job runner report failed")
        finally:
            for part in parts:
                part.done.set()

