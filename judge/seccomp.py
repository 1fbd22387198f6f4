"""Keep the graded code from changing files' permissions, owners, times or extended attributes
(Linux seccomp; no privileges needed).

Landlock (`judge.sandbox`) decides who may read and write a file's contents, not its metadata: a
process allowed to read a file of the repository could still `chmod 000` it, or a folder, and
break every later grading. A seccomp filter refuses these calls outright (EPERM), wherever the
path is: the engine and the cases never make them while grading.

A filter is for good: it holds for the process and everything it starts.
"""

from __future__ import annotations

import ctypes
import platform
import struct
from typing import Dict, Optional, Tuple

_PR_SET_NO_NEW_PRIVS, _PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 38, 22, 2
_LD_ABS_W, _JEQ_K, _JGE_K, _RET_K = 0x20, 0x15, 0x35, 0x06  # classic BPF opcodes
_RET_ALLOW, _RET_EPERM = 0x7FFF0000, 0x00050000 | 1  # SECCOMP_RET_ERRNO | EPERM
_X32_BIT = 0x40000000  # x86-64's x32 calls: another number for the same call, refused whole

# per machine: (AUDIT_ARCH_*, the calls that change metadata)
_CALLS: Dict[str, Tuple[int, Tuple[int, ...]]] = {
    # chmod fchmod fchmodat fchmodat2 chown fchown lchown fchownat utime utimes futimesat utimensat
    # setxattr lsetxattr fsetxattr removexattr lremovexattr fremovexattr setxattrat removexattrat
    "x86_64": (0xC000003E, (90, 91, 268, 452, 92, 93, 94, 260, 132, 235, 261, 280, 188, 189, 190, 197, 198, 199, 463, 466)),
    # fchmod fchmodat fchmodat2 fchownat fchown utimensat setxattr lsetxattr fsetxattr removexattr
    # lremovexattr fremovexattr setxattrat removexattrat
    "aarch64": (0xC00000B7, (52, 53, 452, 54, 55, 88, 5, 6, 7, 14, 15, 16, 463, 466)),
}
_CALLS["arm64"] = _CALLS["aarch64"]


class _Filter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]


class _Prog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_uint16), ("filter", ctypes.POINTER(_Filter))]


def program(arch: int, calls: Tuple[int, ...], x32: bool) -> bytes:
    """The filter: another architecture's calls pass (none is expected); the listed calls (and,
    on x86-64, any x32 call) get EPERM; everything else passes. Eight bytes an instruction."""
    n = len(calls)
    ins = [(_LD_ABS_W, 0, 0, 4)]  # seccomp_data.arch
    ins.append((_JEQ_K, 0, n + 1 + (1 if x32 else 0), arch))  # not ours: jump to ALLOW
    ins.append((_LD_ABS_W, 0, 0, 0))  # seccomp_data.nr
    if x32:
        ins.append((_JGE_K, n + 1, 0, _X32_BIT))  # to EPERM
    for i, nr in enumerate(calls):
        ins.append((_JEQ_K, n - i, 0, nr))  # to EPERM, past the remaining checks and ALLOW
    ins.append((_RET_K, 0, 0, _RET_ALLOW))
    ins.append((_RET_K, 0, 0, _RET_EPERM))
    return b"".join(struct.pack("=HBBI", *i) for i in ins)


def available() -> bool:
    return platform.system() == "Linux" and platform.machine() in _CALLS


def forbid_metadata_changes() -> Optional[str]:
    """Install the filter on this process. Returns None once installed, or why it could not be."""
    if not available():
        return f"no seccomp filter for {platform.system()} on {platform.machine()}"
    arch, calls = _CALLS[platform.machine()]
    code = program(arch, calls, x32=platform.machine() == "x86_64")
    buf = (_Filter * (len(code) // 8)).from_buffer_copy(code)
    prog = _Prog(len(buf), ctypes.cast(buf, ctypes.POINTER(_Filter)))
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        return f"prctl(PR_SET_NO_NEW_PRIVS) failed (errno {ctypes.get_errno()})"
    if libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0) != 0:
        return f"the seccomp filter was refused (errno {ctypes.get_errno()})"
    return None
