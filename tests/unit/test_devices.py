"""GPUs fenced by the devices controller (workers/devices.py, workers/devbpf.py, and their use
in workers/isolation.py).

The rule list and the v2 device program's encoding are checked as tables (the program run by a
small interpreter of the instructions it uses). Then real job processes run in job cgroups
beside fake GPU device nodes: character devices of NVIDIA's major 195, minors 0 and 1, made with
mknod in a temporary directory. With no driver behind them, a device the fence allows opens with
ENXIO and one it denies with EPERM: a job allowed one GPU must get ENXIO on it and EPERM on the
other (ENXIO there means the fence is missing), and /dev/null must still work. On cgroup v1
through the ``devices`` hierarchy (both ways a job enters its cgroup, and through the runner),
on cgroup v2 through a device program attached to the job's cgroup on the cgroup2 mount.

These skip only where the host has no writable devices controller (or cannot mknod); with
``$CI`` set they fail instead, since CI runs on a host that has one.
"""

from __future__ import annotations

import errno
import logging
import os
import struct
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.config.core import Config
from broker.cycle.plan import Plan, Start
from broker.model import Allocation, Gpu, JobSpec, Node
from broker.store.memory import MemoryStore
from tests.unit.test_isolation import wait_for
from tests.unit.test_isolation_v2 import cgroup2_mount
from workers import cgroupfs, devbpf, devices, keeper
from workers.agent import Agent
from workers.detection import detect
from workers.devices import Rule
from workers.isolation import Isolation, JobBox
from workers.runner import RunningPart, Supervisor

A100 = "A100-80GB"
PROC_DEVICES = """Character devices:
  1 mem
  5 /dev/tty
136 pts
195 nvidia
235 nvidia-caps
509 nvidia-uvm

Block devices:
  7 loop
235 nvidia-uvm
"""
MAJORS = devices.char_majors(PROC_DEVICES)
PSEUDO = [r.v1() for r in devices.PSEUDO]
CONTROL = ["c 195:255 rwm", "c 195:254 rwm"]
UVM = ["c 509:0 rwm", "c 509:1 rwm"]
NODE = (
    Gpu("GPU-0", 0, A100, 80.0),  # minor: its index
    Gpu("GPU-1", 1, A100, 80.0, minor=3),  # /dev/nvidia3, not /dev/nvidia1
    Gpu("GPU-2", 2, A100, 80.0, mig_enabled=True, minor=2),
    Gpu("MIG-2-0", 2, A100, 10.0, mig_profile="1g.10gb", parent="GPU-2", minor=2, caps=(21, 22)),
    Gpu("MIG-2-1", 2, A100, 10.0, mig_profile="1g.10gb", parent="GPU-2", minor=2, caps=(30, 31)),
    Gpu("MIG-x", 5, A100, 10.0, mig_profile="1g.10gb", parent="GPU-5"),  # caps not found
)


# -- the rule list -----------------------------------------------------------------------------


@pytest.mark.parametrize("gpu_ids, majors, own", [
    ((), MAJORS, []),
    (("GPU-0",), MAJORS, ["c 195:0 rwm"]),
    (("GPU-1",), MAJORS, ["c 195:3 rwm"]),  # the minor discovery found, not the index
    (("GPU-0", "GPU-1"), MAJORS, ["c 195:0 rwm", "c 195:3 rwm"]),
    (("MIG-2-0",), MAJORS, ["c 195:2 rwm", "c 235:21 rwm", "c 235:22 rwm"]),
    (("MIG-2-0", "MIG-2-1"), MAJORS,  # the parent once, each instance's caps
     ["c 195:2 rwm", "c 235:21 rwm", "c 235:22 rwm", "c 235:30 rwm", "c 235:31 rwm"]),
    (("MIG-x",), MAJORS, ["c 195:5 rwm"]),  # caps unknown: the parent GPU only
    (("MIG-2-0",), {}, ["c 195:2 rwm"]),  # no nvidia-caps major: the parent GPU only
    (("GPU-9",), MAJORS, []),  # not a GPU of this node: nothing
])
def test_rules_a_part_gets(gpu_ids: tuple[str, ...], majors: dict[str, int], own: list[str]
                           ) -> None:
    rules = devices.rules_for(NODE, gpu_ids, majors, uvm_node="/nonexistent")
    uvm = UVM if "nvidia-uvm" in majors else []
    assert [r.v1() for r in rules] == PSEUDO + CONTROL + uvm + own


def test_the_pseudo_devices_are_those_every_process_needs() -> None:
    assert PSEUDO == ["c 1:3 rwm", "c 1:5 rwm", "c 1:7 rwm", "c 1:8 rwm", "c 1:9 rwm",
                      "c 5:0 rwm", "c 5:2 rwm", "c 136:* rwm"]


def test_a_gpu_not_of_the_node_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="workers.devices"):
        devices.rules_for(NODE, ("GPU-0", "GPU-9"), MAJORS)
    assert "GPU-9 are not among this node's GPUs" in caplog.text


def test_proc_devices_majors_are_the_character_ones() -> None:
    assert MAJORS == {"mem": 1, "/dev/tty": 5, "pts": 136, "nvidia": 195, "nvidia-caps": 235,
                      "nvidia-uvm": 509}  # (not the block device of the same name)


def test_uvm_major_from_its_device_node_when_proc_devices_lacks_it(tmp_path: Path) -> None:
    node = tmp_path / "nvidia-uvm"
    if not can_mknod(node, 511, 0):
        pytest.skip("cannot mknod here")
    assert devices.uvm_major({}, str(node)) == 511
    assert devices.uvm_major({"nvidia-uvm": 509}, str(node)) == 509
    assert devices.uvm_major({}, str(tmp_path / "none")) is None


@pytest.mark.parametrize("rule, text", [
    (Rule("c", 195, 0), "c 195:0 rwm"),
    (Rule("c", 136, None), "c 136:* rwm"),
    (Rule("b", 7, 1, "r"), "b 7:1 r"),
])
def test_v1_rule_text(rule: Rule, text: str) -> None:
    assert rule.v1() == text


@pytest.mark.parametrize("kind, major, minor, access", [
    ("x", 1, 3, "rwm"), ("c", -1, 3, "rwm"), ("c", 4096, 0, "rwm"), ("c", 1, 2**20, "rwm"),
    ("c", 1, 3, ""), ("c", 1, 3, "rwx"),
])
def test_bad_rules_are_refused(kind: str, major: int, minor: int, access: str) -> None:
    with pytest.raises(ValueError):
        Rule(kind, major, minor, access)


def test_gpu_minor_round_trips_and_old_records_load() -> None:
    node = Node("n", NODE)
    again = Node.from_dict(node.to_dict())
    assert again.gpus == NODE
    assert "minor" not in node.to_dict()["gpus"][0] and "caps" not in node.to_dict()["gpus"][0]
    old = {"id": "GPU-0", "index": 4, "model": A100, "memory_gb": 80.0, "mig_profile": None,
           "parent": None, "mig_enabled": False}  # written before minors existed
    assert Gpu.from_dict(old).device_minor == 4 and Gpu.from_dict(old).caps == ()


# -- the v2 device program's encoding ----------------------------------------------------------


def run_program(code: bytes, kind: int, access: int, major: int, minor: int) -> int:
    """Run the device program on one request, as the kernel would (the opcodes it uses)."""
    ctx = struct.pack("=III", access << 16 | kind, major, minor)
    regs = [0] * 11
    insns = [struct.unpack("=BBhi", code[i:i + 8]) for i in range(0, len(code), 8)]
    pc = 0
    for _ in range(10_000):
        op, r, off, imm = insns[pc]
        dst, src = r & 0xF, r >> 4
        pc += 1
        if op == devbpf.LDX_MEM_W:
            assert src == 1, "loads only from the context"
            regs[dst] = struct.unpack_from("=I", ctx, off)[0]
        elif op == devbpf.ALU32_AND_K:
            regs[dst] = (regs[dst] & imm) & 0xFFFFFFFF
        elif op == devbpf.ALU32_RSH_K:
            regs[dst] = (regs[dst] & 0xFFFFFFFF) >> imm
        elif op == devbpf.ALU64_MOV_K:
            regs[dst] = imm
        elif op == devbpf.ALU64_MOV_X:
            regs[dst] = regs[src]
        elif op == devbpf.JMP_JNE_K:
            if regs[dst] != imm:
                pc += off
        elif op == devbpf.JMP_EXIT:
            return regs[0]
        else:
            raise AssertionError(f"opcode {op:#x}")
    raise AssertionError("no exit")


C, B = devbpf.DEV_CHAR, devbpf.DEV_BLOCK
R, W, M = devbpf.ACC_READ, devbpf.ACC_WRITE, devbpf.ACC_MKNOD
RULES = (Rule("c", 1, 3), Rule("c", 136, None), Rule("c", 195, 0), Rule("c", 10, 200, "r"))


@pytest.mark.parametrize("kind, access, major, minor, allowed", [
    (C, R | W, 1, 3, 1),  # /dev/null
    (C, M, 1, 3, 1),
    (B, R, 1, 3, 0),  # a block device of the same numbers
    (C, R, 1, 4, 0),
    (C, R | W, 136, 0, 1), (C, R | W, 136, 4711, 1),  # any pts
    (C, R | W, 195, 0, 1),  # its GPU
    (C, R | W, 195, 1, 0),  # another GPU
    (C, R | W, 195, 255, 0),  # not in RULES
    (C, R, 10, 200, 1), (C, R | W, 10, 200, 0), (C, M, 10, 200, 0),  # read only
    (C, R, 0, 0, 0),
])
def test_device_program_allows_exactly_its_rules(kind: int, access: int, major: int,
                                                  minor: int, allowed: int) -> None:
    assert run_program(devbpf.program(RULES), kind, access, major, minor) == allowed


def test_device_program_instructions() -> None:
    """The encoding, instruction by instruction, of one rule (jumps skip to the block's end)."""
    code = devbpf.program([Rule("c", 195, 7)])
    insns = [struct.unpack("=BBhi", code[i:i + 8]) for i in range(0, len(code), 8)]
    assert insns == [
        (0x61, 0x12, 0, 0),  # r2 = *(u32 *)(r1 + 0)
        (0x54, 0x02, 0, 0xFFFF),  # w2 &= 0xffff
        (0x61, 0x13, 0, 0),  # r3 = *(u32 *)(r1 + 0)
        (0x74, 0x03, 0, 16),  # w3 >>= 16
        (0x61, 0x14, 4, 0),  # r4 = major
        (0x61, 0x15, 8, 0),  # r5 = minor
        (0x55, 0x02, 4, 2),  # if r2 != char goto +4
        (0x55, 0x04, 3, 195),  # if r4 != 195 goto +3
        (0x55, 0x05, 2, 7),  # if r5 != 7 goto +2
        (0xB7, 0x00, 0, 1),  # r0 = 1
        (0x95, 0x00, 0, 0),  # exit
        (0xB7, 0x00, 0, 0),  # r0 = 0
        (0x95, 0x00, 0, 0),  # exit
    ]


def test_an_empty_program_denies_everything() -> None:
    assert run_program(devbpf.program([]), C, R, 1, 3) == 0


# -- real job processes beside fake GPU device nodes -------------------------------------------


def require(ok: bool, reason: str) -> None:
    """Skip for ``reason`` where this host cannot run the test; under CI, fail."""
    if ok:
        return
    if os.environ.get("CI"):
        pytest.fail(f"{reason}: CI must run this test (it proves GPUs are fenced)")
    pytest.skip(reason)


def can_mknod(path: Path, major: int, minor: int) -> bool:
    try:
        os.mknod(path, 0o666 | 0o020000, os.makedev(major, minor))  # S_IFCHR
        return True
    except PermissionError:
        return False


@pytest.fixture
def gpu_nodes(tmp_path: Path) -> dict[int, str]:
    """``/dev/nvidia0`` and ``/dev/nvidia1`` look-alikes (195:0, 195:1), no driver behind."""
    out = {}
    for minor in (0, 1):
        path = tmp_path / f"nvidia{minor}"
        require(can_mknod(path, devices.NVIDIA_MAJOR, minor), "cannot mknod a character device")
        out[minor] = str(path)
    try:
        os.close(os.open(out[0], os.O_RDWR))
    except OSError as e:  # unfenced, as the test process is: no driver
        require(e.errno == errno.ENXIO, f"{out[0]} opens with {os.strerror(e.errno or 0)}, "
                "not ENXIO (a nodev file system?)")
    return out


OPENER = r"""
import errno, os, sys
for p in sys.argv[1:]:
    try:
        os.close(os.open(p, os.O_RDWR))
        print(p, "ok")
    except OSError as e:
        print(p, errno.errorcode.get(e.errno, e.errno))
"""


def opened(output: str) -> dict[str, str]:
    return dict(line.rsplit(" ", 1) for line in output.strip().splitlines())


def run_in(box: JobBox, paths: list[str]) -> dict[str, str]:
    """A job process in ``box`` (as the runner starts one) opens ``paths``: what each gave."""
    with box.entering():
        p = subprocess.Popen(box.argv([sys.executable, "-S", "-c", OPENER, *paths]),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = p.communicate(timeout=30)
    assert p.returncode == 0, err
    return opened(out)


def expect(nodes: dict[int, str], allowed: int) -> dict[str, str]:
    denied = 1 - allowed
    return {nodes[allowed]: "ENXIO", nodes[denied]: "EPERM", "/dev/null": "ok"}


def v1_devices_usable() -> bool:
    return all(os.access(f"/sys/fs/cgroup/{c}", os.W_OK)
               and os.path.exists(f"/sys/fs/cgroup/{c}/cgroup.procs")
               for c in (*keeper.V1_CONTROLLERS, cgroupfs.V1_DEVICES))


@pytest.fixture
def v1(tmp_path: Path) -> Iterator[Isolation]:
    require(v1_devices_usable(), "no writable cgroup v1 devices hierarchy (with memory, cpu, "
            "pids, freezer) here")
    iso = detect(f"dev-{uuid.uuid4().hex[:8]}", str(tmp_path / "agent"), pids_max=64,
                 v2_root=str(tmp_path / "no-v2"), gpus=(Gpu("GPU-a", 0, A100, 80.0),
                                                       Gpu("GPU-b", 1, A100, 80.0)))
    try:
        assert iso.kind == "v1", iso.missing
        assert iso.fence == "v1", iso.fence_missing
        yield iso
    finally:
        keeper.kill_node(iso.kind, iso.node_dirs, iso.pgroup_dir)
        for d in iso.node_dirs:
            keeper.remove(d)


@pytest.mark.parametrize("way", ["thread", "shell"])
def test_v1_job_opens_its_gpu_and_not_the_other(v1: Isolation, gpu_nodes: dict[int, str],
                                                way: str) -> None:
    v1.by_thread = way == "thread"
    box = v1.box("j", 1, 0, memory_gb=0, cpus=0, gpu_ids=("GPU-a",))
    try:
        dev = next(d for d in box.dirs if "/devices/" in d)
        listed = Path(dev, "devices.list").read_text().split("\n")
        assert "c 195:0 rwm" in listed and "c 195:1 rwm" not in listed
        assert "a *:* rwm" not in listed
        assert run_in(box, [gpu_nodes[0], gpu_nodes[1], "/dev/null"]) == expect(gpu_nodes, 0)
    finally:
        box.release()
    other = v1.box("k", 1, 0, memory_gb=0, cpus=0, gpu_ids=("GPU-b",))
    try:
        assert run_in(other, [gpu_nodes[0], gpu_nodes[1], "/dev/null"]) == expect(gpu_nodes, 1)
    finally:
        other.release()
    assert not any(os.path.exists(d) for d in box.dirs + other.dirs)


def test_the_runner_fences_a_job_to_the_gpus_it_was_given(v1: Isolation,
                                                          gpu_nodes: dict[int, str]) -> None:
    """Through the supervisor, as the agent starts a job: the part's gpu_ids reach its cgroup,
    and a GPU's minor is the one discovery found (GPU-a is /dev/nvidia1 here)."""
    gpus = (Gpu("GPU-a", 0, A100, 80.0, minor=1), Gpu("GPU-b", 1, A100, 80.0, minor=0))
    v1.gpus = gpus
    store = MemoryStore()
    store.heartbeat(Node("n1", gpus, incarnation="i"), 1e9, 0)
    sup = Supervisor(store, v1.work_dir, grace_s=5, isolation=v1)
    try:
        argv = [sys.executable, "-S", "-c", OPENER, gpu_nodes[0], gpu_nodes[1], "/dev/null"]
        job = store.submit(JobSpec(gpus=1, command=argv), 0.0)
        start = Start(job.id, job.attempt, job.version, (Allocation("n1", ("GPU-a",)),))
        assert store.apply(Plan(starts=(start,)), 1.0).started
        part: RunningPart = sup.spawn(store.get(job.id), 0, ("GPU-a",), "n1")
        wait_for(part.done.is_set, 30, "the job to end")
        assert part.exit_code == 0, part.reason
        log = Path(v1.work_dir, "logs", f"{job.id}.1.log").read_text()
        got = opened("\n".join(line.split(" ", 1)[1] for line in log.splitlines()))
        assert got == expect(gpu_nodes, 1)
    finally:
        sup.close()


def test_the_agent_gives_its_isolation_the_nodes_gpus(tmp_path: Path) -> None:
    """The node's GPUs (their minors) reach the fence: the agent hands them to detect()."""
    require(v1_devices_usable() or cgroup2_mount() is not None, "no cgroups here")
    gpus = (Gpu("GPU-a", 0, A100, 80.0, minor=1), Gpu("GPU-b", 1, A100, 80.0, minor=0))
    agent = Agent(MemoryStore(), Config(heartbeat_s=60.0, job_isolation=False),
                  Node(f"dev-{uuid.uuid4().hex[:8]}", gpus, incarnation="i"),
                  str(tmp_path / "agent"))
    try:
        assert agent.isolation.gpus == gpus
    finally:
        agent.close()
        for d in agent.isolation.node_dirs:
            keeper.remove(d, wait_s=0)


def test_v2_device_program_fences_a_job(tmp_path: Path, gpu_nodes: dict[int, str]) -> None:
    """On the cgroup2 mount (here ``/sys/fs/cgroup/unified``, with no controllers: a device
    program needs none), the job's cgroup gets a device program before the job enters it."""
    root = cgroup2_mount()
    require(root is not None, "no writable cgroup2 mount here")
    assert root is not None
    require(cgroupfs.own_v2_cgroup() == "/" or os.geteuid() == 0,
            "this process's cgroup2 subtree is delegated to it: detect would move it")
    iso = detect(f"dev2-{uuid.uuid4().hex[:8]}", str(tmp_path / "agent"), v2_root=root,
                 v2_controllers=(), warn=False,
                 gpus=(Gpu("GPU-a", 0, A100, 80.0), Gpu("GPU-b", 1, A100, 80.0)))
    try:
        assert iso.kind == "v2", iso.missing
        require(iso.fence == "bpf", f"no device program can be attached here "
                f"({iso.fence_missing})")
        box = iso.box("j", 1, 0, memory_gb=0, cpus=0, gpu_ids=("GPU-a",))
        try:
            assert devbpf.attached(box.dirs[0]) == 1
            assert run_in(box, [gpu_nodes[0], gpu_nodes[1], "/dev/null"]) == expect(gpu_nodes, 0)
        finally:
            box.release()
        assert not os.path.exists(box.dirs[0])
    finally:
        keeper.kill_node(iso.kind, iso.node_dirs, iso.pgroup_dir)
        for d in iso.node_dirs:
            keeper.remove(d)


def test_without_a_fence_the_agent_says_gpus_rest_on_cuda_visible_devices(
        tmp_path: Path, caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A v2 host whose kernel refuses the device program (no CAP_BPF, say): one warning, and
    jobs still start, in their cgroup, unfenced."""
    root = tmp_path / "cg"
    root.mkdir()
    (root / "cgroup.controllers").write_text("cpu memory pids\n")
    (root / "cgroup.subtree_control").write_text("")

    def refuse(cgroup_dir: str, rules: object) -> None:
        raise devbpf.BpfError(errno.EPERM, "loading the device program (BPF_PROG_LOAD): "
                              "Operation not permitted")

    monkeypatch.setattr(devbpf, "attach", refuse)
    with caplog.at_level(logging.WARNING):
        iso = detect("n", str(tmp_path / "agent"), v2_root=str(root))
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert iso.kind == "v2" and iso.fence == ""
    assert len(warnings) == 1
    assert "GPUs are fenced only by CUDA_VISIBLE_DEVICES" in warnings[0]
    assert "needs CAP_BPF or CAP_SYS_ADMIN" in warnings[0]
    box = iso.box("j", 1, 0, memory_gb=1, cpus=1, gpu_ids=("GPU-a",))
    assert box.dirs  # its cgroup, without a fence
    box.release()


def test_a_fence_that_fails_at_a_start_fails_the_start(v1: Isolation,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the agent fences devices, a job never runs unfenced: its box is refused and its
    cgroup and scratch removed."""
    def broken(cgroup_dir: str, rules: object) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(devices, "write_v1", broken)
    with pytest.raises(devices.FenceError, match="cannot fence the job's devices"):
        v1.box("j", 1, 0, memory_gb=0, cpus=0, gpu_ids=("GPU-a",))
    assert not any(os.path.exists(os.path.join(d, "j-1-0")) for d in v1.node_dirs)
    assert not os.path.exists(os.path.join(v1.scratch_root, "j-1-0"))
