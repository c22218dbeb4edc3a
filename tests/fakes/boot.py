"""Test-side boot for fake GCE instances and libcloud nodes: a machine that "boots" runs its
boot script (the GCE ``startup-script`` metadata, the node's user data) as a local process,
so the worker agent a real machine would start really starts and registers.

:class:`Machines` runs scripts: each machine gets a directory, a metadata service of its own
(tests/fake_metadata.py: the GCE ``/computeMetadata/v1/instance/name`` the rendered script
asks for, ``instance/preempted`` for the agent's spot watcher) and a process in its own
session, ``$SPILLWAY_METADATA_URL`` pointing at that service. When the cloud deletes the
machine its processes get SIGTERM (an OS shutdown), then SIGKILL after ``grace_s``.

:func:`boot_gce` hooks it to the fake Compute endpoint's listeners (an instance starts RUNNING:
boot; preempted: its metadata says so; deleted: halt). :class:`LibcloudBooter` polls a
libcloud driver's nodes.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.boot_shim import signal_group, stop_groups
from tests.fake_metadata import MetadataServer
from tests.fakes.gce import FakeCompute


@dataclass
class Machine:
    name: str
    meta: MetadataServer
    proc: subprocess.Popen[bytes]
    log: Path

    def logs(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


class Machines:
    """Boot scripts as local processes, one machine each."""

    def __init__(self, workdir: Path, env: Mapping[str, str] | None = None,
                 grace_s: float = 15.0) -> None:
        self.workdir, self.grace_s = workdir, grace_s
        self.env = dict(env if env is not None else os.environ)
        self.machines: dict[str, Machine] = {}
        self.booted = 0
        self.halted = 0
        self._lock = threading.Lock()

    def boot(self, name: str, script: str, zone: str = "", machine_type: str = "") -> None:
        with self._lock:
            if name in self.machines:
                return
            home = self.workdir / name
            home.mkdir(parents=True, exist_ok=True)
            (home / "boot.sh").write_text(script)
            meta = MetadataServer(name, zone, machine_type).start()
            env = {**self.env, "SPILLWAY_METADATA_URL": meta.url, "HOME": str(home),
                   "SPILLWAY_STATE_DIR": str(home / "state")}
            log = home / "boot.log"
            with open(log, "ab") as out:
                proc = subprocess.Popen(["sh", str(home / "boot.sh")], cwd=home, env=env,
                                        stdout=out, stderr=subprocess.STDOUT,
                                        start_new_session=True)
            self.machines[name] = Machine(name, meta, proc, log)
            self.booted += 1

    def halt(self, name: str) -> None:
        """SIGTERM now, SIGKILL after the grace (in a thread: the caller does not wait)."""
        with self._lock:
            m = self.machines.get(name)
        if m is None or m.proc.poll() is not None:
            return
        self.halted += 1
        signal_group(m.proc, signal.SIGTERM)
        threading.Thread(target=self._reap, args=(m,), daemon=True).start()

    def _reap(self, m: Machine) -> None:
        try:
            m.proc.wait(timeout=self.grace_s)
        except subprocess.TimeoutExpired:
            signal_group(m.proc, signal.SIGKILL)
            m.proc.wait()
        m.meta.stop()

    def running(self) -> list[str]:
        with self._lock:
            return [n for n, m in self.machines.items() if m.proc.poll() is None]

    def stop(self) -> None:
        with self._lock:
            machines = list(self.machines.values())
        stop_groups([m.proc for m in machines], self.grace_s)
        for m in machines:
            with contextlib.suppress(Exception):
                m.meta.stop()
        for m in machines:
            print(f"----- machine {m.name} boot log tail -----\n{m.logs()[-2000:]}")


def boot_gce(fake: FakeCompute, machines: Machines) -> None:
    """Boot each fake GCE instance when it starts RUNNING; halt it when it is deleted."""

    def running(inst: dict[str, Any]) -> None:
        items = {i["key"]: i["value"] for i in inst.get("metadata", {}).get("items", [])}
        machines.boot(inst["name"], items.get("startup-script", ""),
                      inst["zone"].rsplit("/", 1)[-1], inst["machineType"].rsplit("/", 1)[-1])

    def preempted(inst: dict[str, Any]) -> None:
        m = machines.machines.get(inst["name"])
        if m is not None:
            m.meta.interrupt()  # instance/preempted says TRUE from now on

    fake.on_running.append(running)
    fake.on_preempted.append(preempted)
    fake.on_gone.append(lambda inst: machines.halt(inst["name"]))


class LibcloudBooter:
    """Polls a libcloud driver (tests/fakes/libcloud_driver.py keeps user data on its nodes):
    boots each new node with user data, halts the ones that went away."""

    def __init__(self, driver: Any, machines: Machines, interval_s: float = 0.2) -> None:
        self.driver, self.machines, self.interval_s = driver, machines, interval_s
        self._quit = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="libcloud-boot", daemon=True)

    def start(self) -> LibcloudBooter:
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._quit.wait(self.interval_s):
            nodes = {n.name: n for n in self.driver.list_nodes()}
            for name, node in nodes.items():
                if node.extra.get("userdata") and name not in self.machines.machines:
                    self.machines.boot(name, node.extra["userdata"], "", str(node.size.id))
            for name in self.machines.running():
                if name not in nodes:
                    self.machines.halt(name)

    def stop(self) -> None:
        self._quit.set()
        self._thread.join(10)


@contextlib.contextmanager
def booted_gce(fake: FakeCompute, workdir: Path,
               env: Mapping[str, str] | None = None) -> Iterator[Machines]:
    machines = Machines(workdir, env)
    boot_gce(fake, machines)
    try:
        yield machines
    finally:
        machines.stop()
