"""The ``local`` provider: "rents" machines that are processes on this host.

A launch starts the machine's boot script (the user data: it execs ``spillway worker``) as a
process in its own session and process group, after a configured boot delay, with a configured
inventory (``gpus: 2xA100-80GB``, a static inventory), CPUs, memory and price per hour. Its
site is ``<name>:<region>:<zone>:<market>`` (``local:home:home-a:ondemand`` by default), so a
real burst, with real agents, happens on one machine.

Machines are tracked in files under ``state_dir/<cluster>/``: one JSON file per machine (its
tags: cluster and request id; its pid and the process's start time), written *before* the
process starts, and the process carries the same tags in its environment. So a restarted
provisioner still lists every machine, a repeated launch with the same request id returns the
machine the first one started, and a provisioner killed between writing the file and recording
the pid still finds the process by its tags. ``terminate`` sends SIGTERM to the process group
(the agent drains), then SIGKILL after ``stop_timeout_s``; an unknown id is not an error.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from broker.model.cloud import InstanceState, Market, Offer, Site
from broker.model.gpus import parse_inventory, type_matches
from providers.base import (
    CLUSTER_TAG,
    REQUEST_TAG,
    CloudMachine,
    ProviderConfigError,
    Resources,
    check_label,
)

TAG_ENV = "SPILLWAY_LOCAL_MACHINE"  # "<cluster>/<provider id>" in each machine's environment
_MEM = re.compile(r"-(\d+)GB$")


class LocalProvider:
    """Machines as local processes (see the module docstring)."""

    def __init__(self, name: str, cluster: str, gpus: str = "2xA100-80GB", cpus: float = 8,
                 memory_gb: float = 32, price_per_hour: float = 2.0, region: str = "home",
                 zone: str = "home-a", market: str = "ondemand", instance_type: str = "",
                 boot_delay_s: float = 1.0, stop_timeout_s: float = 10.0,
                 api_delay_s: float = 0.0,
                 state_dir: str = "~/.local/state/spillway/local-cloud",
                 carbon_zone: str = "", offer_extra: Any = None) -> None:
        self.name, self.cluster = name, check_label(cluster, "cluster")
        where = f"providers.{name}"
        try:
            entries = parse_inventory(gpus)
            site = Site(name, region, zone, market)  # type: ignore[arg-type]
        except ValueError as e:
            raise ProviderConfigError(f"{where}: {e}") from None
        if len({e.model for e in entries}) != 1:
            raise ProviderConfigError(f"{where}.gpus: {gpus!r} must be one GPU model, e.g. "
                                      "2xA100-80GB (a cloud instance type has one)")
        for key, value in (("price_per_hour", price_per_hour), ("boot_delay_s", boot_delay_s),
                           ("stop_timeout_s", stop_timeout_s), ("api_delay_s", api_delay_s),
                           ("cpus", cpus),
                           ("memory_gb", memory_gb)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise ProviderConfigError(f"{where}.{key}: {value!r} must be a number >= 0")
        if offer_extra is not None and not isinstance(offer_extra, dict):
            raise ProviderConfigError(f"{where}.offer_extra: {offer_extra!r} must be a mapping "
                                      "(e.g. {boot_s: 180, region_quota_gpus: 64})")
        model, count = entries[0].model, sum(e.count for e in entries)
        mem = _MEM.search(model)
        self.offer = Offer(name, site.region, site.zone,
                           instance_type or f"local-{count}x{model.lower()}", model, count,
                           float(mem.group(1)) if mem else 0.0, site.market or Market.ONDEMAND,
                           float(price_per_hour), carbon_zone,
                           extra={**(offer_extra or {}), "gpus": gpus, "cpus": cpus,
                                  "memory_gb": memory_gb})  # offer_extra: what the
        # policies read from an offer (boot_s, region_quota_gpus, ...; broker/fidelity sets it)
        self.boot_delay_s, self.stop_timeout_s = float(boot_delay_s), float(stop_timeout_s)
        self.api_delay_s = float(api_delay_s)  # a launch call returns this long after the
        # machine started, as a cloud API's does (a provisioner can die in between)
        self.dir = Path(state_dir).expanduser() / self.cluster
        self._children: dict[str, subprocess.Popen[bytes]] = {}

    # -- the interface ---------------------------------------------------------------------

    def offers(self, request: Resources) -> list[Offer]:
        o = self.offer
        ok = (o.gpu_count >= request.gpu_count
              and o.gpu_memory_gb >= request.min_gpu_memory_gb
              and (not request.gpu_model or type_matches(o.gpu_model, request.gpu_model))
              and (request.market is None or request.market is o.market)
              and (not request.regions or o.region in request.regions))
        return [o] if ok else []

    def launch(self, offer: Offer, count: int, request_id: str,
               user_data: str) -> list[CloudMachine]:
        check_label(request_id, "request id")
        if offer.id != self.offer.id:
            from providers.base import Stop

            raise Stop(self.name, f"offer {offer.id} is not this provider's ({self.offer.id})",
                       code="unknown-offer", offer_id=offer.id)
        self.dir.mkdir(parents=True, exist_ok=True)
        ids = [f"local-{request_id}"] if count == 1 else \
            [f"local-{request_id}-{i}" for i in range(1, count + 1)]
        machines = [self._launch_one(pid, request_id, user_data) for pid in ids]
        if self.api_delay_s:
            time.sleep(self.api_delay_s)
        return machines

    def terminate(self, provider_ids: Sequence[str]) -> None:
        for pid in provider_ids:
            rec = self._read(pid)
            if rec is None:
                continue  # unknown: already gone
            proc = self._process(rec)
            if proc is not None:
                self._stop_group(pid, proc)
            self._path(pid).unlink(missing_ok=True)
            self._path(pid, ".sh").unlink(missing_ok=True)
            self._children.pop(pid, None)

    def instances(self) -> dict[str, CloudMachine]:
        out: dict[str, CloudMachine] = {}
        if not self.dir.is_dir():
            return out
        now = time.time()
        for path in sorted(self.dir.glob("*.json")):
            rec = self._read(path.stem)
            if rec is None or rec.get(CLUSTER_TAG) != self.cluster:
                continue
            out[rec["id"]] = self._machine(rec, now)
        return out

    # -- machines --------------------------------------------------------------------------

    def _launch_one(self, pid: str, request_id: str, user_data: str) -> CloudMachine:
        rec = self._read(pid)
        if rec is not None:  # launched before (a repeated message, a restarted provisioner)
            if not rec.get("pid") and self._process(rec) is None and \
                    time.time() - rec["launched_at"] > 5.0:
                rec = self._start(rec, user_data)  # the file was written, the process never
            return self._machine(rec, time.time())
        now = time.time()
        rec = {"id": pid, CLUSTER_TAG: self.cluster, REQUEST_TAG: request_id,
               "offer": self.offer.id, "launched_at": now, "boot_at": now + self.boot_delay_s,
               "pid": 0, "started": 0.0}
        self._write(rec)  # first the record, so the machine is never unlisted
        return self._machine(self._start(rec, user_data), now)

    def _start(self, rec: dict[str, Any], user_data: str) -> dict[str, Any]:
        pid = rec["id"]
        script = self._path(pid, ".sh")
        script.write_text(user_data)
        log = open(self._path(pid, ".log"), "ab")  # noqa: SIM115 (the child holds it)
        env = {**os.environ, TAG_ENV: f"{self.cluster}/{pid}", "SPILLWAY_INSTANCE_ID": pid}
        delay = max(0.0, rec["boot_at"] - time.time())
        try:
            proc = subprocess.Popen(["/bin/sh", "-c", f"sleep {delay:.3f}; exec /bin/sh \"$0\"",
                                     str(script)], env=env, stdin=subprocess.DEVNULL,
                                    stdout=log, stderr=subprocess.STDOUT, cwd=self.dir,
                                    start_new_session=True)
        finally:
            log.close()
        self._children[pid] = proc
        rec = {**rec, "pid": proc.pid, "started": _create_time(proc.pid)}
        self._write(rec)
        return rec

    def _machine(self, rec: dict[str, Any], now: float) -> CloudMachine:
        alive = self._process(rec) is not None
        if alive:
            state = InstanceState.BOOTING if now < rec["boot_at"] else InstanceState.READY
            native = "booting" if state is InstanceState.BOOTING else "running"
        elif not rec.get("pid") and now - rec["launched_at"] < 5.0:
            state, native = InstanceState.REQUESTED, "starting"  # (being started right now)
        else:
            state, native = InstanceState.TERMINATED, "dead"
        o = self.offer
        return CloudMachine(rec["id"], rec.get(REQUEST_TAG, ""), state, o.instance_type,
                            o.zone, o.market, rec["launched_at"], native,
                            extra={"pid": rec.get("pid", 0), "log": str(self._path(rec["id"],
                                                                                   ".log"))})

    def _process(self, rec: dict[str, Any]) -> Any:
        """The machine's live process (its session leader), or None: by the recorded pid and
        start time, else by the tag in the environment of this user's processes."""
        import psutil

        child = self._children.get(rec["id"])
        if child is not None and child.poll() is not None:
            return None  # (reaped)
        pid = rec.get("pid") or 0
        if pid:
            try:
                proc = psutil.Process(pid)
                if abs(proc.create_time() - rec.get("started", 0.0)) < 0.01 and \
                        proc.status() != psutil.STATUS_ZOMBIE:
                    return proc
            except psutil.Error:
                pass
            return None
        tag = f"{self.cluster}/{rec['id']}"
        found = []
        for proc in psutil.process_iter(["pid", "create_time"]):
            with contextlib.suppress(psutil.Error):
                if proc.environ().get(TAG_ENV) == tag and os.getsid(proc.pid) == proc.pid:
                    found.append(proc)
        return min(found, key=lambda p: p.info["create_time"]) if found else None

    def _stop_group(self, provider_id: str, proc: Any) -> None:
        import psutil

        pgid = proc.pid
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGTERM)
        with contextlib.suppress(psutil.Error):
            proc.wait(self.stop_timeout_s)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)
        child = self._children.get(provider_id)
        if child is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.wait(5.0)

    # -- files -----------------------------------------------------------------------------

    def _path(self, pid: str, suffix: str = ".json") -> Path:
        return self.dir / f"{pid}{suffix}"

    def _read(self, pid: str) -> dict[str, Any] | None:
        try:
            data = json.loads(self._path(pid).read_text())
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) else None

    def _write(self, rec: dict[str, Any]) -> None:
        path = self._path(rec["id"])
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(rec))
        os.replace(tmp, path)


def _create_time(pid: int) -> float:
    import psutil

    try:
        return float(psutil.Process(pid).create_time())
    except psutil.Error:
        return 0.0
