"""A test-side stand-in for a cloud machine's boot: a moto EC2 instance "boots" by running its
user data as a local process, so the worker agent a real instance would start really starts.

:class:`BootShim` polls moto for instances tagged with a cluster. For each new pending or
running one it reads the user data back from EC2 (``describe_instance_attribute``), starts a
metadata service for it (tests/fake_metadata.py: its instance id, zone and type, IMDSv2), and
runs the script with ``sh`` in a session of its own, ``$SPILLWAY_METADATA_URL`` pointing at
that service. When EC2 says the instance is shutting down or terminated, the machine's
processes get SIGTERM (what an OS shutdown sends), then SIGKILL after ``grace_s``.
"""

from __future__ import annotations

import base64
import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from providers.base import CLUSTER_TAG
from tests.fake_metadata import MetadataServer


@dataclass
class Machine:
    instance_id: str
    meta: MetadataServer
    proc: subprocess.Popen[bytes]
    log: Path
    stop_at: float | None = None  # when it was told to shut down
    killed: bool = False
    user_data: str = field(default="", repr=False)

    def logs(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


class BootShim:
    """Boots the moto instances of ``cluster`` in ``regions`` as local processes."""

    def __init__(self, ec2_url: str, cluster: str, workdir: Path,
                 env: Mapping[str, str] | None = None,
                 regions: Sequence[str] = ("us-east-1",), grace_s: float = 15.0,
                 interval_s: float = 0.2) -> None:
        import boto3

        self.cluster, self.workdir, self.grace_s = cluster, workdir, grace_s
        self.env = dict(env if env is not None else os.environ)
        self.clients = {r: boto3.client("ec2", region_name=r, endpoint_url=ec2_url)
                        for r in regions}
        self.machines: dict[str, Machine] = {}
        self.booted = 0  # instances started as processes
        self.shut_down = 0  # of which shut down because EC2 terminated them
        self.interval_s = interval_s
        self._lock = threading.Lock()
        self._quit = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="boot-shim", daemon=True)

    # -- the loop ------------------------------------------------------------------------------

    def start(self) -> BootShim:
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._quit.wait(self.interval_s):
            try:
                self.step()
            except Exception as e:  # (moto stopping under it at the end of a test)
                print(f"boot shim: {type(e).__name__}: {e}")

    def step(self) -> None:
        """Boot what is new, shut down what EC2 terminated, kill what outlived its grace."""
        for ec2 in self.clients.values():
            pages = ec2.get_paginator("describe_instances").paginate(
                Filters=[{"Name": f"tag:{CLUSTER_TAG}", "Values": [self.cluster]}])
            for page in pages:
                for res in page["Reservations"]:
                    for inst in res["Instances"]:
                        self._sync(ec2, inst)
        now = time.monotonic()
        with self._lock:
            for m in self.machines.values():
                if m.stop_at is not None and not m.killed and m.proc.poll() is None \
                        and now - m.stop_at > self.grace_s:
                    signal_group(m.proc, signal.SIGKILL)
                    m.killed = True

    def _sync(self, ec2: Any, inst: Mapping[str, Any]) -> None:
        iid, state = inst["InstanceId"], inst["State"]["Name"]
        with self._lock:
            known = self.machines.get(iid)
        if known is None and state in ("pending", "running"):
            self._boot(ec2, inst)
        elif known is not None and known.stop_at is None \
                and state in ("shutting-down", "terminated", "stopping", "stopped"):
            known.stop_at = time.monotonic()
            self.shut_down += 1
            signal_group(known.proc, signal.SIGTERM)

    def _boot(self, ec2: Any, inst: Mapping[str, Any]) -> None:
        iid = inst["InstanceId"]
        attr = ec2.describe_instance_attribute(InstanceId=iid, Attribute="userData")
        script = base64.b64decode(attr.get("UserData", {}).get("Value", "")).decode()
        meta = MetadataServer(iid, inst["Placement"]["AvailabilityZone"],
                              inst["InstanceType"]).start()
        home = self.workdir / iid
        home.mkdir(parents=True, exist_ok=True)
        (home / "user-data").write_text(script)
        log = home / "boot.log"
        env = {**self.env, "SPILLWAY_METADATA_URL": meta.url,
               "SPILLWAY_STATE_DIR": str(home / "state"), "HOME": str(home)}
        with open(log, "ab") as out:
            proc = subprocess.Popen(["sh", str(home / "user-data")], cwd=home, env=env,
                                    stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True)
        with self._lock:
            self.machines[iid] = Machine(iid, meta, proc, log, user_data=script)
            self.booted += 1

    # -- the end -------------------------------------------------------------------------------

    def stop(self) -> None:
        """Stop polling; SIGTERM every machine still running, SIGKILL after the grace."""
        self._quit.set()
        if self._thread.is_alive():
            self._thread.join(10)
        with self._lock:
            machines = list(self.machines.values())
        stop_groups([m.proc for m in machines], self.grace_s)
        for m in machines:
            m.meta.stop()

    def running(self) -> list[str]:
        with self._lock:
            return [i for i, m in self.machines.items() if m.proc.poll() is None]


def signal_group(proc: subprocess.Popen[bytes], sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


def stop_groups(procs: list[subprocess.Popen[bytes]], grace_s: float) -> None:
    """SIGTERM every running process group, SIGKILL those still there after ``grace_s``."""
    for proc in procs:
        if proc.poll() is None:
            signal_group(proc, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for proc in procs:
        try:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            signal_group(proc, signal.SIGKILL)
            proc.wait()


@contextlib.contextmanager
def booting(ec2_url: str, cluster: str, workdir: Path, **kw: Any) -> Iterator[BootShim]:
    shim = BootShim(ec2_url, cluster, workdir, **kw).start()
    try:
        yield shim
    finally:
        shim.stop()
        for m in shim.machines.values():
            print(f"----- machine {m.instance_id} boot log tail -----\n{m.logs()[-2000:]}")
