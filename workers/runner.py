"""The job runner: job processes as children of the agent, watched from one thread.

Threads:

* the **supervisor thread** owns every job process. It forks them (so their parent-death
  signal is tied to a thread that lives as long as the supervisor; see :mod:`workers.procs`),
  waits in one ``selectors`` loop on their stdout/stderr pipes and their ``pidfd`` (exit), and
  on a tick enforces time limits and SIGTERM -> SIGKILL grace deadlines. Other threads talk to
  it through a command queue and a wake-up pipe; it never touches the network.
* the **reporter thread** (:mod:`workers.reporter`) does the slow I/O in order: log batches
  to the store and to ``<work_dir>/logs/<job>.<attempt>.log``, then the ``on_exit`` callback
  of a finished part, whose last log batch is always written first.

A part is a :class:`~workers.parts.RunningPart`; its process is prepared and forked by
:mod:`workers.launch`.

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
import selectors
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from broker.model import Job
from broker.model.values import MAX_TIME_LIMIT_S
from broker.store.events import STOPPED
from workers.launch import Launch, Launcher
from workers.parts import Key, PartStore, RunningPart, time_limit_for
from workers.procs import LineSplitter, StartError, exit_code
from workers.reporter import Reporter
from workers.users import JobUsers

if TYPE_CHECKING:
    from workers.isolation import Isolation

__all__ = ["Key", "PartStore", "RunningPart", "Supervisor", "time_limit_for"]

log = logging.getLogger(__name__)

_POLL_S = 0.05  # exit polling period where pidfd_open is missing
# The longest one select() waits: a timer further off is looked at again when it wakes. epoll
# takes its timeout as milliseconds in a C int: past about 24.8 days it raises OverflowError
# (inf and 1e300 too), which once left the loop failing at once, forever, its jobs unwatched.
_MAX_WAIT_S = 3600.0


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
        self.store, self.grace_s = store, grace_s
        self.flush_s, self.flush_lines, self.clock = flush_s, flush_lines, clock
        self.work_dir = os.path.abspath(os.path.expanduser(work_dir))
        self.log_dir = os.path.join(self.work_dir, "logs")
        os.makedirs(self.log_dir, exist_ok=True)
        # jobs' own directories (working directory, checkpoints): under work_dir, unless
        # jobs could not reach it (workers/users.py jobs_dir)
        self.jobs_dir = os.path.abspath(os.path.expanduser(jobs_dir or work_dir))
        # which user each team's jobs run as (an agent as root; workers/users.py); None: the
        # agent's own. ``job_user`` alone: every team as that one user
        self.users = users if users is not None or not job_user else \
            JobUsers(self.jobs_dir, shared=job_user)
        if self.users is not None:
            os.makedirs(self.jobs_dir, exist_ok=True)
            os.chmod(self.jobs_dir, 0o711)  # jobs pass through to their directories, no more
            os.chmod(self.log_dir, 0o700)
        self.launcher = Launcher(self.jobs_dir, isolation, self.users, clock)
        self._lock = threading.Lock()
        self._parts: dict[Key, RunningPart] = {}  # written by the supervisor thread only
        self._cmds: collections.deque[tuple[Any, ...]] = collections.deque()
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._sel = selectors.DefaultSelector()
        self._sel.register(self._wake_r, selectors.EVENT_READ, None)
        self._timers: list[tuple[float, int, str, RunningPart]] = []
        self._seq = itertools.count()
        self._dirty: dict[Key, float] = {}  # parts with buffered lines -> first line time
        self._polled: set[RunningPart] = set()  # parts without a pidfd
        self.reporter = Reporter(store, self.log_dir, clock, self._lock, self.kill, on_exit,
                                 on_exits)
        self._closing = False
        self._thread = threading.Thread(target=self._loop, name="spillway-supervisor",
                                        daemon=True)
        self._thread.start()
        self.reporter.start()

    # -- public API (any thread) ---------------------------------------------------------------

    def spawn(self, job: Job, rank: int, gpu_ids: tuple[str, ...], node_id: str) -> RunningPart:
        """Start ``job``'s part ``rank`` with exactly ``gpu_ids`` visible. A part that cannot
        start (missing workdir or command) is reported StartFailed and returned with
        ``start_error`` set; nothing is raised."""
        return self.spawn_many([(job, rank, gpu_ids)], node_id)[0]

    def spawn_many(self, items: list[tuple[Job, int, tuple[str, ...]]], node_id: str
                   ) -> list[RunningPart]:
        launches: list[Launch] = []
        out: list[RunningPart] = []
        for job, rank, gpu_ids in items:
            part = RunningPart(job.id, job.attempt, rank, tuple(gpu_ids))
            out.append(part)
            try:
                launches.append(self._prepare(job, part, node_id))
            except StartError as e:
                self.reporter.start_failed(part, str(e))
        if launches and threading.current_thread() is self._thread:
            self._do_spawn(launches)  # called from an on-loop callback: no hand-off
        elif launches:
            self._command(("spawn", launches))
            for launch in launches:
                try:
                    launch.future.result()
                except (OSError, ValueError) as e:
                    why = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
                    self.reporter.start_failed(launch.part,
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
        idle = self.reporter.idle
        with idle:
            return idle.wait_for(lambda: not self._parts and not self.reporter.pending, timeout)

    def close(self, timeout: float = 10.0) -> None:
        """SIGKILL every job process group, wait for their reports, stop the threads."""
        self._closing = True
        self.kill_all()
        self.wait_idle(timeout)
        self._command(("quit",))
        self._thread.join(timeout)
        self.launcher.close()
        self.reporter.close(timeout)

    # -- preparing a start (caller's thread) ---------------------------------------------------

    def _prepare(self, job: Job, part: RunningPart, node_id: str) -> Launch:
        if self._closing:
            raise StartError("the agent is shutting down")
        return self.launcher.prepare(job, part, node_id)

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

    def _do_spawn(self, launches: list[Launch]) -> None:
        """Fork the launches' processes (:meth:`Launcher.fork_many`), then watch them from
        this thread, in order."""
        for launch, forked in zip(launches, self.launcher.fork_many(launches)):
            if isinstance(forked, BaseException):  # OSError; ValueError: a NUL in argv or env
                launch.future.set_exception(forked)
            else:
                launch.future.set_result(self._watch(launch, *forked))

    def _watch(self, launch: Launch, proc: subprocess.Popen[bytes], out_r: int, err_r: int
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
            part.signal_group(signal.SIGKILL)
            return
        if part._kill_at is None:
            part.signal_group(signal.SIGTERM)
        if part._kill_at is None or kill_at < part._kill_at:
            part._kill_at = kill_at
            self._timer(kill_at, "kill", part)

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
                part.signal_group(signal.SIGKILL)
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
            self._report(lambda: self.reporter.write_logs(part, lines))

    def _finish(self, part: RunningPart) -> None:
        """The main process exited: kill its group, reap, collect its last output, report."""
        if part._pidfd >= 0:
            self._sel.unregister(part._pidfd)
            os.close(part._pidfd)
            part._pidfd = -1
        self._polled.discard(part)
        part.signal_group(signal.SIGKILL)  # not reaped yet: the group id cannot be reused
        assert part._proc is not None
        returncode = part._proc.wait()
        code = exit_code(returncode)
        for fd, (stream, splitter) in list(part._pipes.items()):
            lines = splitter.drain(fd)
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

    # -- to the reporter thread ------------------------------------------------------------

    def _report(self, item: Callable[[], None] | RunningPart, remove: Key | None = None
                ) -> None:
        """Hand ``item`` to the reporter thread; ``remove``: the part leaves the table in the
        same step (:meth:`Reporter.put`)."""
        self.reporter.put(item, None if remove is None else lambda: self._parts.pop(remove))
