"""cgroup v2's device fence: a ``BPF_PROG_TYPE_CGROUP_DEVICE`` program, built here as raw
instructions and loaded with the bpf(2) syscall through ctypes (no dependency).

The kernel runs the program on every open or mknod of a device node by a process of the cgroup
it is attached to (``BPF_CGROUP_DEVICE``), with ``struct bpf_cgroup_dev_ctx { u32 access_type;
u32 major; u32 minor; }`` (``access_type``: the device type ``BPF_DEVCG_DEV_BLOCK`` 1 or
``_CHAR`` 2 in its low 16 bits, the access ``BPF_DEVCG_ACC_MKNOD`` 1 | ``_READ`` 2 | ``_WRITE``
4 in its high 16); 1 allows, 0 denies (EPERM). The program::

    r2 = ctx->access_type & 0xffff        # type
    r3 = ctx->access_type >> 16           # access
    r4 = ctx->major; r5 = ctx->minor
    for each rule:                        # one block; a mismatch jumps to the next block
        if r2 != type: next
        if r3 & ~allowed access: next     # (omitted for rwm)
        if r4 != major: next
        if r5 != minor: next              # (omitted for any minor)
        return 1
    return 0

It is the shape runc's device filter has. Loading needs CAP_BPF or CAP_SYS_ADMIN and attaching
CAP_NET_ADMIN or CAP_SYS_ADMIN (a root agent has them); :class:`BpfError` says what failed.
"""

from __future__ import annotations

import collections
import ctypes
import errno
import os
import platform
import struct
import threading
from collections.abc import Sequence

from workers.devrule import Rule

# bpf(2) commands, program and attach types, flags (linux/bpf.h)
BPF_PROG_LOAD, BPF_PROG_ATTACH, BPF_PROG_QUERY = 5, 8, 16
BPF_PROG_TYPE_CGROUP_DEVICE = 15
BPF_CGROUP_DEVICE = 6
BPF_F_ALLOW_MULTI = 2
DEV_BLOCK, DEV_CHAR = 1, 2
ACC_MKNOD, ACC_READ, ACC_WRITE = 1, 2, 4
_ACC = {"m": ACC_MKNOD, "r": ACC_READ, "w": ACC_WRITE}

# instruction opcodes (class | size/op | mode/source)
LDX_MEM_W = 0x61  # dst = *(u32 *)(src + off)
ALU32_AND_K = 0x54  # w_dst &= imm
ALU32_RSH_K = 0x74  # w_dst >>= imm
ALU64_MOV_K = 0xB7  # dst = imm
ALU64_MOV_X = 0xBF  # dst = src
JMP_JNE_K = 0x55  # if dst != imm: pc += off
JMP_EXIT = 0x95

SYSCALL_BPF = {"x86_64": 321, "aarch64": 280, "arm64": 280, "ppc64le": 361, "s390x": 351,
               "riscv64": 280}


class BpfError(OSError):
    """The device program could not be loaded or attached (``errno`` and what was tried)."""


def insn(code: int, dst: int = 0, src: int = 0, off: int = 0, imm: int = 0) -> bytes:
    """One ``struct bpf_insn``: u8 code, u8 dst:4 | src:4 (little endian), s16 off, s32 imm."""
    if imm >= 2**31:
        imm -= 2**32
    regs = (src << 4 | dst) if _little() else (dst << 4 | src)
    return struct.pack("=BBhi", code, regs, off, imm)


def _little() -> bool:
    return struct.pack("=H", 1)[0] == 1


def _mask(access: str) -> int:
    out = 0
    for c in access:
        out |= _ACC[c]
    return out


def _block(rule: Rule) -> list[bytes]:
    """One rule's instructions; each ``JNE`` jumps past the end of the block."""
    kind = DEV_CHAR if rule.kind == "c" else DEV_BLOCK
    tests: list[tuple[int, int, int, int, int]] = [(JMP_JNE_K, 2, 0, 0, kind)]
    mask = _mask(rule.access)
    pre: list[tuple[int, int, int, int, int]] = []
    if mask != ACC_MKNOD | ACC_READ | ACC_WRITE:
        pre = [(ALU64_MOV_X, 1, 3, 0, 0), (ALU32_AND_K, 1, 0, 0, ~mask & 0xFFFFFFFF)]
        tests += [*pre, (JMP_JNE_K, 1, 0, 0, 0)]
    tests.append((JMP_JNE_K, 4, 0, 0, rule.major))
    if rule.minor is not None:
        tests.append((JMP_JNE_K, 5, 0, 0, rule.minor))
    length = len(tests) + 2  # and r0 = 1; exit
    out = []
    for i, (code, dst, src, _, imm) in enumerate(tests):
        off = length - (i + 1) if code == JMP_JNE_K else 0
        out.append(insn(code, dst, src, off, imm))
    return [*out, insn(ALU64_MOV_K, 0, imm=1), insn(JMP_EXIT)]


def program(rules: Sequence[Rule]) -> bytes:
    """The device program allowing exactly ``rules``, as instructions."""
    head = [
        insn(LDX_MEM_W, 2, 1, 0),  # r2 = access_type
        insn(ALU32_AND_K, 2, imm=0xFFFF),  # type
        insn(LDX_MEM_W, 3, 1, 0),
        insn(ALU32_RSH_K, 3, imm=16),  # access
        insn(LDX_MEM_W, 4, 1, 4),  # major
        insn(LDX_MEM_W, 5, 1, 8),  # minor
    ]
    body = [i for rule in rules for i in _block(rule)]
    tail = [insn(ALU64_MOV_K, 0, imm=0), insn(JMP_EXIT)]  # deny
    return b"".join(head + body + tail)


# -- the syscall -------------------------------------------------------------------------------


class _LoadAttr(ctypes.Structure):
    _fields_ = [("prog_type", ctypes.c_uint32), ("insn_cnt", ctypes.c_uint32),
                ("insns", ctypes.c_uint64), ("license", ctypes.c_uint64),
                ("log_level", ctypes.c_uint32), ("log_size", ctypes.c_uint32),
                ("log_buf", ctypes.c_uint64), ("kern_version", ctypes.c_uint32),
                ("prog_flags", ctypes.c_uint32), ("prog_name", ctypes.c_char * 16),
                ("prog_ifindex", ctypes.c_uint32), ("expected_attach_type", ctypes.c_uint32)]


class _AttachAttr(ctypes.Structure):
    _fields_ = [("target_fd", ctypes.c_uint32), ("attach_bpf_fd", ctypes.c_uint32),
                ("attach_type", ctypes.c_uint32), ("attach_flags", ctypes.c_uint32),
                ("replace_bpf_fd", ctypes.c_uint32)]


class _QueryAttr(ctypes.Structure):
    _fields_ = [("target_fd", ctypes.c_uint32), ("attach_type", ctypes.c_uint32),
                ("query_flags", ctypes.c_uint32), ("attach_flags", ctypes.c_uint32),
                ("prog_ids", ctypes.c_uint64), ("prog_cnt", ctypes.c_uint32)]


_libc: ctypes.CDLL | None = None


def _bpf(cmd: int, attr: ctypes.Structure, what: str) -> int:
    global _libc
    nr = SYSCALL_BPF.get(platform.machine())
    if nr is None:
        raise BpfError(errno.ENOSYS, f"{what}: no bpf(2) syscall number known for "
                       f"{platform.machine()}")
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    _libc.syscall.restype = ctypes.c_long
    ret = int(_libc.syscall(ctypes.c_long(nr), ctypes.c_int(cmd), ctypes.byref(attr),
                            ctypes.c_uint(ctypes.sizeof(attr))))
    if ret < 0:
        err = ctypes.get_errno()
        raise BpfError(err, f"{what}: {os.strerror(err)}")
    return ret


def load(rules: Sequence[Rule]) -> int:
    """Load the device program for ``rules``; its file descriptor (close-on-exec)."""
    code = program(rules)
    buf = ctypes.create_string_buffer(code, len(code))
    lic = ctypes.create_string_buffer(b"Apache-2.0")
    log_buf = ctypes.create_string_buffer(4096)
    attr = _LoadAttr(prog_type=BPF_PROG_TYPE_CGROUP_DEVICE, insn_cnt=len(code) // 8,
                     insns=ctypes.addressof(buf), license=ctypes.addressof(lic),
                     prog_name=b"spillway_dev", expected_attach_type=BPF_CGROUP_DEVICE)
    try:
        return _bpf(BPF_PROG_LOAD, attr, "loading the device program (BPF_PROG_LOAD)")
    except BpfError as e:
        if e.errno != errno.EINVAL:
            raise
    # rejected by the verifier: ask again with its log, to say why
    attr.log_level, attr.log_size, attr.log_buf = 1, 4096, ctypes.addressof(log_buf)
    try:
        return _bpf(BPF_PROG_LOAD, attr, "loading the device program (BPF_PROG_LOAD)")
    except BpfError as e:
        verdict = log_buf.value.decode(errors="replace").strip().splitlines()
        raise BpfError(e.errno, f"{e.strerror}; verifier: {' / '.join(verdict[-3:])}"
                       ) from None


_CACHE_SIZE = 64
_loaded: collections.OrderedDict[tuple[Rule, ...], int] = collections.OrderedDict()
_lock = threading.Lock()


def _program_fd(rules: tuple[Rule, ...]) -> int:
    """The loaded program for ``rules`` (call with ``_lock`` held: an eviction closes fds).
    One load serves every job with the same devices: a load runs the verifier (~0.4 ms), an
    attach of a loaded program takes microseconds. The last :data:`_CACHE_SIZE` rule sets
    stay loaded."""
    fd = _loaded.get(rules)
    if fd is not None:
        _loaded.move_to_end(rules)
        return fd
    fd = _loaded[rules] = load(rules)
    while len(_loaded) > _CACHE_SIZE:
        os.close(_loaded.popitem(last=False)[1])
    return fd


def attach(cgroup_dir: str, rules: Sequence[Rule]) -> None:
    """Attach the program for ``rules`` to the v2 cgroup ``cgroup_dir``. The cgroup holds the
    program from then on (it goes when the cgroup is removed)."""
    cg = os.open(cgroup_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        with _lock:
            attr = _AttachAttr(target_fd=cg, attach_bpf_fd=_program_fd(tuple(rules)),
                               attach_type=BPF_CGROUP_DEVICE, attach_flags=BPF_F_ALLOW_MULTI)
            _bpf(BPF_PROG_ATTACH, attr, f"attaching the device program to {cgroup_dir} "
                 "(BPF_PROG_ATTACH)")
    finally:
        os.close(cg)


def attached(cgroup_dir: str) -> int:
    """How many device programs are attached to the cgroup itself (BPF_PROG_QUERY)."""
    cg = os.open(cgroup_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        ids = (ctypes.c_uint32 * 64)()
        attr = _QueryAttr(target_fd=cg, attach_type=BPF_CGROUP_DEVICE,
                          prog_ids=ctypes.addressof(ids), prog_cnt=64)
        _bpf(BPF_PROG_QUERY, attr, f"querying {cgroup_dir} (BPF_PROG_QUERY)")
        return int(attr.prog_cnt)
    finally:
        os.close(cg)
