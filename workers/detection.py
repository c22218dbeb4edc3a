"""Which isolation this host allows for jobs, detected once at agent start (:func:`detect`): cgroup
v2, cgroup v1 or none, and whether jobs' devices can be fenced; :mod:`workers.isolation` says
what each gives a job.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence

from broker.model import Gpu
from workers import cgroupfs, devices
from workers.cgroupfs import V2_CONTROLLERS
from workers.isolation import Isolation, safe_name

log = logging.getLogger(__name__)


def detect(node_id: str, work_dir: str, pids_max: int = 4096,
           v2_root: str | None = None, v1_root: str = "/sys/fs/cgroup",
           warn: bool = True, v2_controllers: tuple[str, ...] = V2_CONTROLLERS,
           gpus: Sequence[Gpu] = ()) -> Isolation:
    """The best isolation this host allows. ``v2_root``: the cgroup2 mount (default: the one
    at ``/sys/fs/cgroup``, else ``/sys/fs/cgroup/unified``); ``v2_controllers``: those v2
    needs (tests pass fewer to run membership and kill on a mount without controllers);
    ``gpus``: the node's GPUs, whose device minors the jobs' device fences allow."""
    node = safe_name(node_id)
    reasons = []
    roots = [v2_root] if v2_root else ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"]
    for root in roots:
        if not os.path.exists(os.path.join(root, "cgroup.controllers")):
            continue
        try:
            node_dir = cgroupfs.make_v2(root, node, v2_controllers)
        except OSError as e:
            reasons.append(f"cgroup v2 at {root}: {e}")
            continue
        iso = Isolation("v2", [node_dir], work_dir, pids_max, controllers=v2_controllers)
        break
    else:
        if not reasons:
            reasons.append("no cgroup v2 mount")
        try:
            iso = Isolation("v1", cgroupfs.make_v1(v1_root, node), work_dir, pids_max)
            devdir, iso.fence_missing = devices.v1_node_dir(v1_root, node)
            if devdir:  # (last of the node's directories)
                iso.node_dirs.append(devdir)
                iso.fence = devices.V1
            iso.by_thread = _thread_can_enter(iso)
        except OSError as e:
            reasons.append(f"cgroup v1: {e}")
            iso = Isolation("none", [], work_dir, pids_max, missing="; ".join(reasons))
    if iso.kind == "none":
        if warn:
            log.warning(
                "no cgroups for jobs (%s): jobs are not isolated (CPUs, memory, pids are not "
                "limited; memory_gb is not enforced and an out-of-memory kill is not reported "
                "as such) and are killed by process group, so a process that leaves its group "
                "can outlive its job; GPUs are fenced only by CUDA_VISIBLE_DEVICES, which a "
                "job can reset", iso.missing)
    else:
        log.info("jobs run in cgroup %s under %s (%s)", iso.kind, ", ".join(iso.node_dirs),
                 "the forking thread enters each job's cgroups" if iso.by_thread else
                 "each job's process moves itself in through a shell step")
    iso.gpus = tuple(gpus)
    if iso.kind == "v2":
        iso.fence_missing = devices.probe(devices.BPF, iso.node_dirs[0])
        iso.fence = "" if iso.fence_missing else devices.BPF
    devices.report(iso.fence, iso.fence_missing, warn and iso.kind != "none")  # (none: said)
    iso.clean_leftovers()
    return iso


def _thread_can_enter(iso: Isolation) -> bool:
    """v1: can this thread move itself into the node's cgroups and back (``tasks``)?"""
    try:
        home = iso.home_fds()
    except OSError as e:
        log.info("cgroup v1: cannot open this thread's own tasks files (%s)", e)
        return False
    try:
        cgroupfs.enter(iso.node_dirs)
    except OSError as e:
        log.info("cgroup v1: a thread cannot enter the node's cgroups (%s)", e)
        return False
    finally:
        cgroupfs.go_home(home, iso.node_dirs)
    return True
