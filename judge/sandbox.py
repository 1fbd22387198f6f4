"""Where the graded code may read and write (Linux Landlock; no privileges needed).

A worker that runs a learner's file restricts itself, after the cases are loaded and before the
file is, so that the learner's code
- cannot read the recorded reference outputs (`judge/reference/`, and `.git`, whose objects hold
  them too), the judge's state (`.judge/`: the progress record, other generated files), the
  judge's private folder (`judge.scratch`: other workers' files, other learners' copies) but for
  its own scratch folder, or an instructor's hidden cases (`--cases-dir`),
- cannot write anywhere in the repository (the judge, the engine, the exercises, the record),
- cannot bind or connect a TCP socket (Landlock ABI 4),
- cannot signal a process outside its sandbox (the judge, the fork server, its keeper, other
  workers) where the kernel scopes signals (Landlock ABI 6),
and may read the rest of the repository (the engine it runs in) and use the rest of the machine
as usual (caches, its scratch folder as TMPDIR). Listing directories stays allowed everywhere:
names are no secret. A folder that holds a closed one is walked entry by entry (see `plan`), so
the graded code can use its existing entries but cannot add new ones to it (to /tmp, say).

A restriction is for good: it holds for the worker and everything it starts, and nothing can
lift it. Where the kernel has no Landlock (before Linux 5.13, or switched off), `restrict` does
nothing and says so; the judge then relies on its other guards (files hashed and put back, the
progress record restored, verdicts decided outside the worker).
"""

from __future__ import annotations

import ctypes
import os
import platform
from pathlib import Path
from typing import Dict, Iterable, Optional

_SYS = {"x86_64": (444, 445, 446), "aarch64": (444, 445, 446), "arm64": (444, 445, 446)}
_PR_SET_NO_NEW_PRIVS = 38
_RULE_PATH_BENEATH = 1

# access rights of the filesystem (linux/landlock.h)
_EXECUTE, _WRITE_FILE, _READ_FILE, _READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
_REMOVE_DIR, _REMOVE_FILE, _MAKE_CHAR, _MAKE_DIR = 1 << 4, 1 << 5, 1 << 6, 1 << 7
_MAKE_REG, _MAKE_SOCK, _MAKE_FIFO, _MAKE_BLOCK, _MAKE_SYM = 1 << 8, 1 << 9, 1 << 10, 1 << 11, 1 << 12
_REFER, _TRUNCATE = 1 << 13, 1 << 14  # ABI 2, ABI 3
_FILE_ONLY = _EXECUTE | _WRITE_FILE | _READ_FILE | _TRUNCATE  # what a rule on a file (not a folder) may grant

READ = _READ_FILE | _READ_DIR
NONE = 0


_NET_ABI, _SCOPE_ABI = 4, 6
_BIND_TCP, _CONNECT_TCP = 1 << 0, 1 << 1
_SCOPE_ABSTRACT_UNIX_SOCKET, _SCOPE_SIGNAL = 1 << 0, 1 << 1


class _RulesetAttr(ctypes.Structure):  # struct landlock_ruleset_attr (ABI 6; earlier kernels read its first fields)
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64), ("scoped", ctypes.c_uint64)]


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def _libc():
    return ctypes.CDLL(None, use_errno=True)


def abi_version() -> int:
    """The kernel's Landlock ABI version; 0 where there is none."""
    nums = _SYS.get(platform.machine())
    if nums is None or not platform.system() == "Linux":
        return 0
    try:
        v = _libc().syscall(nums[0], None, ctypes.c_size_t(0), ctypes.c_uint32(1))  # LANDLOCK_CREATE_RULESET_VERSION
    except (OSError, AttributeError):
        return 0
    return max(int(v), 0)


def available() -> bool:
    return abi_version() >= 1


def _handled(abi: int) -> int:
    rights = (_WRITE_FILE | _READ_FILE | _READ_DIR | _REMOVE_DIR | _REMOVE_FILE | _MAKE_CHAR | _MAKE_DIR | _MAKE_REG | _MAKE_SOCK
              | _MAKE_FIFO | _MAKE_BLOCK | _MAKE_SYM)
    if abi >= 2:
        rights |= _REFER
    if abi >= 3:
        rights |= _TRUNCATE
    return rights


def _rights_at(path: Path, limits: Dict[Path, int], full: int) -> int:
    """The rights of `path`: those of the deepest limited folder it is in, else everything."""
    best, depth = full, -1
    for p, r in limits.items():
        if (path == p or p in path.parents) and len(p.parts) > depth:
            best, depth = r, len(p.parts)
    return best


def plan(limits: Dict[Path, int], full: int) -> Dict[Path, int]:
    """The rules (path -> rights) that give every path the rights `limits` sets for the deepest
    limited folder it is in, and `full` elsewhere. Landlock adds up the rights of a path's rules
    and its ancestors' rules, so a folder holding a more limited one gets no rule itself: its
    entries get theirs, one by one."""
    rules: Dict[Path, int] = {}

    def holds_other(d: Path, r: int) -> bool:
        return any(d in p.parents and v != r for p, v in limits.items())

    def walk(d: Path) -> None:
        try:
            entries = sorted(d.iterdir())
        except OSError:
            return
        for e in entries:
            if e.is_symlink():  # a rule binds to what a link points at: judge the target, or leave the link out
                try:
                    target = e.resolve(strict=True)
                except (OSError, RuntimeError):
                    continue
                r = _rights_at(target, limits, full)
                if r and not (target.is_dir() and holds_other(target, r)):
                    rules[e] = r
                continue
            r = _rights_at(e, limits, full)
            if e.is_dir() and holds_other(e, r):
                walk(e)
            elif r:
                rules[e] = r

    walk(Path("/"))
    return rules


def scopes_signals() -> bool:
    """Whether a confined process is also kept from signalling processes outside its sandbox
    (Landlock ABI 6, Linux 6.12)."""
    return abi_version() >= _SCOPE_ABI


def restrict(no_access: Iterable[Path], read_only: Iterable[Path], readable_files: Iterable[Path] = (),
             writable: Iterable[Path] = ()) -> Optional[str]:
    """Restrict this process (and all it starts) for good: nothing under `no_access`, only reading
    under `read_only`, everything elsewhere; `readable_files` stay readable wherever they are, and
    `writable` folders (inside a no-access one) stay open. Where the kernel can, the process may
    also signal no process outside its sandbox, nor reach an abstract socket outside it.
    Returns None once restricted, or why it could not be (no Landlock here)."""
    abi = abi_version()
    if abi < 1:
        return "this kernel has no Landlock"
    nums = _SYS[platform.machine()]
    libc = _libc()
    full = _handled(abi)
    limits = {Path(p).resolve(): READ for p in read_only}
    limits.update({Path(p).resolve(): NONE for p in no_access})
    limits.update({Path(p).resolve(): full for p in writable})
    # no TCP (ABI 4): the cases need none, and the judge's machine is no one's to reach from here;
    # signals (kill, SIGSTOP) and abstract sockets reach only this sandbox (ABI 6)
    net = _BIND_TCP | _CONNECT_TCP if abi >= _NET_ABI else 0
    scoped = _SCOPE_ABSTRACT_UNIX_SOCKET | _SCOPE_SIGNAL if abi >= _SCOPE_ABI else 0
    attr = _RulesetAttr(full, net, scoped)
    size = 24 if abi >= _SCOPE_ABI else 16 if abi >= _NET_ABI else 8  # the struct as this kernel knows it
    fd = libc.syscall(nums[0], ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0))
    if fd < 0:
        return f"Landlock refused a ruleset (errno {ctypes.get_errno()})"
    try:
        rules = plan(limits, full)
        rules[Path("/")] = rules.get(Path("/"), 0) | _READ_DIR  # names may be listed anywhere
        for f in readable_files:
            rules[Path(f).resolve()] = rules.get(Path(f).resolve(), 0) | _READ_FILE
        for path, rights in rules.items():
            try:
                pfd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except OSError:
                continue  # gone, or a broken link: it stays out of reach
            try:
                if not os.path.isdir(path):
                    rights &= _FILE_ONLY
                if rights:
                    rule = _PathBeneath(rights, pfd)
                    libc.syscall(nums[1], fd, ctypes.c_int(_RULE_PATH_BENEATH), ctypes.byref(rule), ctypes.c_uint32(0))
            finally:
                os.close(pfd)
        if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            return f"prctl(PR_SET_NO_NEW_PRIVS) failed (errno {ctypes.get_errno()})"
        if libc.syscall(nums[2], fd, ctypes.c_uint32(0)) != 0:
            return f"Landlock could not restrict this process (errno {ctypes.get_errno()})"
    finally:
        os.close(fd)
    return None
