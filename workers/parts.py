"""A job part as the runner sees it (:class:`RunningPart`: one rank of one attempt of a job on
this node, while it runs and after it ended), where the runner reports it (:class:`PartStore`),
and the time limit it runs under (:func:`time_limit_for`).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import signal
import subprocess
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from broker.model import Job
from broker.model.values import seconds_text
from broker.store.events import JobEvent
from workers.procs import LineSplitter

__all__ = ["Key", "PartStore", "RunningPart", "drop_env_file", "time_limit_for"]

log = logging.getLogger(__name__)

Key = tuple[str, int, int]  # (job id, attempt, rank)


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

    def signal_group(self, sig: int) -> None:
        """Send ``sig`` to the part's process group (its pid: a new session) while it runs;
        SIGKILL also kills its whole cgroup, processes that left the group included."""
        if self.pid is None or self.exit_code is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, sig)
        if sig == signal.SIGKILL and self._box is not None:
            self._box.kill()

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


def drop_env_file(part: RunningPart) -> None:
    """Remove the environment file of a part run through setpriv (:mod:`workers.launch`)."""
    if part._env_file:
        with contextlib.suppress(OSError):
            os.unlink(part._env_file)
        part._env_file = ""
