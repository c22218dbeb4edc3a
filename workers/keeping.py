"""The agent's end of its keeper (:class:`Keeper`): starts the keeper process
(:mod:`workers.keeper`), which kills the node's job cgroups if the agent dies, even by SIGKILL;
replaces it if it dies; stops it on a clean stop.
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import sys

from workers import keeper
from workers.isolation import Isolation

log = logging.getLogger(__name__)


class Keeper:
    """The agent's end of its keeper: :meth:`stop` on a clean stop, nothing on a crash."""

    def __init__(self, iso: Isolation) -> None:
        self.iso = iso
        self._start()
        iso.keeper = self

    def alive(self) -> bool:
        return self.proc.poll() is None

    def ensure(self) -> None:
        """Start a new keeper if this one died (someone killed it): until then, jobs in
        cgroups are started with a parent-death signal again (:meth:`Isolation.kept`)."""
        if not self.alive() and self.iso.keeper is self:
            log.warning("the keeper (pid %d) exited with %s; starting a new one", self.proc.pid,
                        self.proc.returncode)
            with contextlib.suppress(OSError):
                os.close(self._w)
            self._start()

    def _start(self) -> None:
        r, self._w = os.pipe()  # both close-on-exec: no job inherits the write end
        root = os.path.dirname(os.path.dirname(os.path.abspath(keeper.__file__)))
        code = (f"import sys; sys.path.insert(0, {root!r}); "
                "from workers.keeper import main; main()")
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-S", "-c", code, str(r), self.iso.kind, self.iso.pgroup_dir,
                 *self.iso.node_dirs],
                pass_fds=(r,), start_new_session=True, stdin=subprocess.DEVNULL)
        finally:
            os.close(r)

    def stop(self, timeout: float = 5.0) -> None:
        self.iso.keeper = None
        try:
            os.write(self._w, b"q")
            os.close(self._w)
        except OSError:
            pass
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        # a clean stop: the jobs have ended; leave no empty cgroup of this node behind
        for d in self.iso.node_dirs:
            for name in keeper._listdir(d):
                keeper.remove(os.path.join(d, name), wait_s=0)
            keeper.remove(d, wait_s=0)
