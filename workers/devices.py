"""Which device nodes a job part may open: the rules its cgroup's device fence allows.

A job's cgroup denies every device but these (``rwm``: read, write, mknod):

* the pseudo devices every process needs: ``/dev/null`` 1:3, ``zero`` 1:5, ``full`` 1:7,
  ``random`` 1:8, ``urandom`` 1:9, ``tty`` 5:0, ``ptmx`` 5:2 and the pseudo terminals 136:*;
* NVIDIA's control devices: ``nvidiactl`` 195:255, ``nvidia-modeset`` 195:254, and
  ``nvidia-uvm`` / ``nvidia-uvm-tools`` (minors 0 and 1 of a major the kernel hands out when the
  module loads: read from ``/proc/devices`` at job starts, at most :data:`MAJORS_TTL_S` old,
  since CUDA may load the module after the agent started; else from ``/dev/nvidia-uvm``'s own
  node);
* the part's own GPUs: ``/dev/nvidiaN`` 195:N for each of its devices (a MIG instance: its
  parent GPU's ``N``) and, for a MIG instance, the ``/dev/nvidia-caps/nvidia-cap*`` minors of
  its GPU and compute instances (major ``nvidia-caps`` in ``/proc/devices``) where discovery
  found them.

Everything else, the node's other GPUs among it, is denied. :mod:`workers.isolation` writes
the rules to a v1 ``devices`` cgroup, or attaches them as a v2 device program
(:mod:`workers.devbpf`). A rule itself is :class:`workers.devrule.Rule`.
"""

from __future__ import annotations

import errno
import logging
import os
import stat
import time
from collections.abc import Iterable, Mapping, Sequence

from broker.model import Gpu
from workers import cgroupfs, devbpf, keeper
from workers.devrule import Rule
from workers.keeper import _read, write

log = logging.getLogger(__name__)

NVIDIA_MAJOR = 195
NVIDIACTL_MINOR = 255
MODESET_MINOR = 254
UVM_NAME = "nvidia-uvm"  # (its name in /proc/devices; minor 0 nvidia-uvm, 1 nvidia-uvm-tools)
CAPS_NAME = "nvidia-caps"  # /dev/nvidia-caps/nvidia-cap<minor>


def _char(major: int, minor: int | None) -> Rule:
    return Rule("c", major, minor)


PSEUDO: tuple[Rule, ...] = (
    _char(1, 3),  # /dev/null
    _char(1, 5),  # /dev/zero
    _char(1, 7),  # /dev/full
    _char(1, 8),  # /dev/random
    _char(1, 9),  # /dev/urandom
    _char(5, 0),  # /dev/tty
    _char(5, 2),  # /dev/ptmx
    _char(136, None),  # /dev/pts/*
)

NVIDIA_CONTROL: tuple[Rule, ...] = (
    _char(NVIDIA_MAJOR, NVIDIACTL_MINOR),  # /dev/nvidiactl
    _char(NVIDIA_MAJOR, MODESET_MINOR),  # /dev/nvidia-modeset
)


def char_majors(proc_devices: str) -> dict[str, int]:
    """Name -> major of the character devices in ``/proc/devices``' text."""
    out: dict[str, int] = {}
    in_char = False
    for line in proc_devices.splitlines():
        if line.strip().endswith("devices:"):
            in_char = line.strip().startswith("Character")
            continue
        major, _, name = line.strip().partition(" ")
        if in_char and major.isdigit() and name:
            out.setdefault(name.strip(), int(major))
    return out


def read_majors(proc_devices: str = "/proc/devices") -> dict[str, int]:
    return char_majors(_read(proc_devices))


MAJORS_TTL_S = 2.0  # (reading /proc/devices costs ~0.1 ms; a module loaded since is seen after)
_majors: tuple[float, dict[str, int]] = (-MAJORS_TTL_S, {})


def current_majors() -> dict[str, int]:
    """``/proc/devices``' character majors, read again when older than :data:`MAJORS_TTL_S`."""
    global _majors
    now = time.monotonic()
    if now - _majors[0] >= MAJORS_TTL_S:
        _majors = (now, read_majors())
    return _majors[1]


def uvm_major(majors: Mapping[str, int], node: str = "/dev/nvidia-uvm") -> int | None:
    """``nvidia-uvm``'s major: from ``/proc/devices``, else from its device node."""
    if UVM_NAME in majors:
        return majors[UVM_NAME]
    try:
        st = os.stat(node)
    except OSError:
        return None
    return os.major(st.st_rdev) if stat.S_ISCHR(st.st_mode) else None


def gpu_rules(node_gpus: Iterable[Gpu], gpu_ids: Sequence[str], caps_major: int | None
              ) -> tuple[tuple[Rule, ...], list[str]]:
    """The rules for the part's devices ``gpu_ids`` among the node's GPUs, and the ids not
    found there (allowed nothing: the job cannot open them)."""
    by_id = {g.id: g for g in node_gpus}
    rules: list[Rule] = []
    unknown: list[str] = []
    for gid in gpu_ids:
        g = by_id.get(gid)
        if g is None:
            unknown.append(gid)
            continue
        rules.append(_char(NVIDIA_MAJOR, g.device_minor))
        if g.caps and caps_major is not None:
            rules += [_char(caps_major, m) for m in g.caps]
    return tuple(dict.fromkeys(rules)), unknown


def rules_for(node_gpus: Iterable[Gpu], gpu_ids: Sequence[str],
              majors: Mapping[str, int] | None = None, uvm_node: str = "/dev/nvidia-uvm"
              ) -> tuple[Rule, ...]:
    """Every rule a part with ``gpu_ids`` gets, in order: pseudo devices, NVIDIA control
    devices, its GPUs. ``majors``: ``/proc/devices``' character majors (read when None)."""
    if majors is None:
        majors = current_majors()
    control = list(NVIDIA_CONTROL)
    uvm = uvm_major(majors, uvm_node)
    if uvm is not None:
        control += [_char(uvm, 0), _char(uvm, 1)]  # nvidia-uvm, nvidia-uvm-tools
    own, unknown = gpu_rules(node_gpus, gpu_ids, majors.get(CAPS_NAME))
    if unknown:
        log.warning("GPU device(s) %s are not among this node's GPUs: the job may not open "
                    "them", ", ".join(unknown))
    return tuple(dict.fromkeys((*PSEUDO, *control, *own)))


# -- applying the rules ------------------------------------------------------------------------


class FenceError(OSError):
    """A job's device fence could not be put in place (its start fails: it never runs
    unfenced where the agent fences devices)."""


V1, BPF = "v1", "bpf"  # the two fences: a v1 devices cgroup, a v2 device program
PROBE = "spillway-device-probe"  # (a job's cgroup name always ends in -<attempt>-<rank>)


def apply(fence: str, cgroup_dir: str, rules: Sequence[Rule]) -> None:
    """Put ``fence`` on the (empty) cgroup ``cgroup_dir``: it may open only ``rules``'
    devices. FenceError if it cannot."""
    try:
        if fence == BPF:
            devbpf.attach(cgroup_dir, rules)
        else:
            write_v1(cgroup_dir, rules)
    except OSError as e:
        raise FenceError(e.errno, f"cannot fence the job's devices in {cgroup_dir}: "
                         f"{e.strerror or e}") from None


def probe(fence: str, parent: str) -> str:
    """Can ``fence`` be put on a cgroup under ``parent``? Tried on a probe cgroup, removed
    after: "" if so, else what is missing."""
    path = os.path.join(parent, PROBE)
    try:
        os.makedirs(path, exist_ok=True)
        apply(fence, path, PSEUDO)
        return ""
    except OSError as e:
        why = e.strerror or str(e)
        if fence == BPF and e.errno in (errno.EPERM, errno.EACCES, errno.EINVAL, errno.ENOSYS):
            why += " (a device program needs CAP_BPF or CAP_SYS_ADMIN, and a kernel with " \
                   "CONFIG_CGROUP_BPF)"
        return f"{'cgroup v2 device program' if fence == BPF else 'cgroup v1 devices'}: {why}"
    finally:
        keeper.remove(path, wait_s=0)


def write_v1(cgroup_dir: str, rules: Sequence[Rule]) -> None:
    """Deny every device to the v1 devices cgroup ``cgroup_dir``, then allow ``rules``. An
    allow its parent does not grant (EPERM, e.g. an agent in a container without GPUs) is
    skipped: that device is denied either way."""
    write(os.path.join(cgroup_dir, "devices.deny"), "a")
    allow = os.path.join(cgroup_dir, "devices.allow")
    for rule in rules:
        try:
            write(allow, rule.v1())
        except PermissionError:
            log.debug("%s: %s not granted by the parent cgroup; left denied", cgroup_dir,
                      rule.v1())


def v1_node_dir(v1_root: str, node: str) -> tuple[str, str]:
    """v1: the devices hierarchy's node directory, where a probe cgroup there takes a fence;
    else ("", what is missing)."""
    try:
        d = cgroupfs.make_v1_devices(v1_root, node)
    except OSError as e:
        return "", f"cgroup v1 devices: {e}"
    why = probe(V1, d)
    if why:
        keeper.remove(d, wait_s=0)
        return "", why
    return d, ""


def report(fence: str, why: str, warn: bool) -> None:
    """The agent's one line on its jobs' device fence: how, or (a warning) what is missing
    and what that means."""
    if fence:
        log.info("jobs may open only their own GPUs' device nodes (%s)",
                 "cgroup v1 devices" if fence == V1 else "cgroup v2 device program")
    elif warn:
        log.warning("job devices are not fenced (%s): GPUs are fenced only by "
                    "CUDA_VISIBLE_DEVICES, which a job can reset to open the node's other "
                    "GPUs", why)
