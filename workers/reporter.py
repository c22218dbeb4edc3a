"""What the runner reports: a part that could not start (at once), and, on the reporter thread,
the slow I/O of job parts, in order, off the supervisor thread.

It writes log batches to the store and to ``<work_dir>/logs/<job>.<attempt>.log``, then runs
the ``on_exit`` callback of a finished part. A part's last log batch is always written before
its ``on_exit`` runs. It takes what is queued in batches: with ``on_exits``, the parts that
ended meanwhile are handed over together (one call, so their owner can report them in one
round trip).
"""

from __future__ import annotations

import logging
import os
import queue
import threading
from collections.abc import Callable

from broker.errors import JobNotFound, StaleAttempt
from broker.store.events import StartFailed
from workers.parts import PartStore, RunningPart, drop_env_file

log = logging.getLogger("workers.runner")  # (the runner's log, as before the split)

REPORT_BATCH = 256  # items taken at once

#: a log write to run, a part that ended (its on_exit), or None (quit)
Item = Callable[[], None] | RunningPart | None


class Reporter:
    """The reporter thread and its queue. ``lock`` is the supervisor's: :meth:`put` counts an
    item as pending under it, so the supervisor can wait (on :attr:`idle`) until no part runs
    and no report is due."""

    def __init__(self, store: PartStore, log_dir: str, clock: Callable[[], float],
                 lock: threading.Lock, kill: Callable[[str, int, str], object],
                 on_exit: Callable[[RunningPart], None] | None = None,
                 on_exits: Callable[[list[RunningPart]], None] | None = None) -> None:
        self.store, self.log_dir, self.clock, self.kill = store, log_dir, clock, kill
        self.on_exit, self.on_exits = on_exit, on_exits
        self.idle = threading.Condition(lock)
        self.pending = 0
        self._queue: queue.SimpleQueue[Item] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._loop, name="spillway-reporter",
                                        daemon=True)

    def start(self) -> None:
        self._thread.start()

    def put(self, item: Callable[[], None] | RunningPart,
            before: Callable[[], object] | None = None) -> None:
        """Queue a log write or an ended part; ``before`` runs under the lock in the same step
        as the count (so a waiter never sees a part gone and no report due)."""
        with self.idle:
            if before is not None:
                before()
            self.pending += 1
        self._queue.put(item)

    def start_failed(self, part: RunningPart, message: str) -> None:
        """A part that could not start: reported StartFailed at once (the caller's thread),
        its ``done`` set."""
        drop_env_file(part)
        part.start_error, part.exit_code, part.reason = message, 127, "StartFailed"
        log.warning("job %s attempt %d rank %d: start failed: %s", part.job_id, part.attempt,
                    part.rank, message)
        try:
            part.job_after = self.store.report(part.job_id, part.attempt,
                                               StartFailed(part.rank, message), self.clock())
        except (StaleAttempt, JobNotFound) as e:
            log.info("start failure of a stale attempt dropped: %s", e)
        part.done.set()

    def close(self, timeout: float) -> None:
        """Stop the thread once what is queued is done."""
        self._queue.put(None)
        self._thread.join(timeout)

    def _loop(self) -> None:
        while True:
            batch = [self._queue.get()]
            while len(batch) < REPORT_BATCH:
                try:
                    batch.append(self._queue.get_nowait())
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
            with self.idle:
                self.pending -= len(batch) - quit_
                if not self.pending:
                    self.idle.notify_all()
            if quit_:
                return

    def write_logs(self, part: RunningPart, lines: list[tuple[str, str]]) -> None:
        """Append ``lines`` to the part's log file and to the store; a stale attempt's
        processes are killed."""
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
            drop_env_file(part)
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
