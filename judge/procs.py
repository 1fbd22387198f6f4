"""Keep track of every process a grading starts, so that none outlives its verdict (Linux).

Learner code may fork, `setsid()`, double-fork so that its children are orphaned, or kill the
process that started it. Process groups and sessions do not survive that, but parentage does
when every supervisor on the way is a *child subreaper* (`prctl(PR_SET_CHILD_SUBREAPER)`): an
orphan is then adopted by the nearest supervisor instead of by init. So the judge process, the
fork server and each worker's keeper are subreapers, and everything a worker started stays
below one of them, where `/proc` shows it. `kill_tree` SIGKILLs a set of processes and every
descendant, again and again until none is left (each is stopped first, and a process forking
while it is being killed only adds to the next pass); SIGSTOP and SIGKILL cannot be caught or ignored.

Where the kernel allows it, each worker is also the first process of a pid namespace of its own
(`judge.namespaces`), and the kernel kills everything in it when the worker ends. And nothing
outlives the judge: each process asks the kernel to signal it when its parent ends
(`die_with_parent`), from the fork server down to each worker.

Everything the judge starts carries MARKER=<the judge's pid> in its environment, so an orphan
adopted by the judge process itself (after the fork server was killed) is told apart from the
notebook's own children (and from another judge's processes on a shared machine).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import time
from dataclasses import dataclass
from typing import Dict, Iterable, List, Optional, Set

MARKER = "MINISGL_JUDGE_PROCESS"
_PR_SET_PDEATHSIG, _PR_SET_CHILD_SUBREAPER = 1, 36


@dataclass(frozen=True)
class Proc:
    pid: int
    ppid: int
    start: int  # clock ticks after boot: with the pid, names one process even after pid reuse
    state: str  # "Z": a zombie, already dead


def set_subreaper() -> bool:
    """Make this process adopt its orphaned descendants. False where the OS has no such thing."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def die_with_parent(sig: int, parent: int, parent_start: Optional[int] = None) -> bool:
    """Have the kernel send `sig` to this process when `parent` (the process, or in a threaded
    parent the thread, that forked us) ends. False if it has already ended, in the moment between
    the fork and this call: the caller should exit. Where the OS has no such thing, True."""
    if not sys.platform.startswith("linux"):
        return True
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0)
    except (OSError, AttributeError):
        return True
    ppid = os.getppid()
    # 0: the parent is outside our pid namespace (a worker, its first process): ask /proc instead
    return ppid == parent or (ppid == 0 and alive(parent, parent_start))


def read(pid: int) -> Optional[Proc]:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read().decode(errors="replace")
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    rest = data[data.rindex(")") + 2:].split()  # the command name may hold spaces and parentheses
    return Proc(pid, int(rest[1]), int(rest[19]), rest[0])


def children(pid: int) -> List[int]:
    """The process's children (from its own list where the kernel keeps one: no scan of /proc)."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(x) for x in f.read().split()]
    except (FileNotFoundError, ProcessLookupError, PermissionError, ValueError):
        return [p.pid for p in table().values() if p.ppid == pid]


def namespace_pid(pid: int) -> Optional[int]:
    """The process's pid in its own (innermost) pid namespace; None once it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("NSpid:"):
                    return int(line.split()[-1])
    except (FileNotFoundError, ProcessLookupError, PermissionError, ValueError):
        pass
    return None


def table() -> Dict[int, Proc]:
    out: Dict[int, Proc] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            p = read(int(name))
            if p is not None:
                out[p.pid] = p
    return out


def alive(pid: int, start: Optional[int] = None) -> bool:
    """The process exists and is not a zombie (and, given `start`, is the same process)."""
    p = read(pid)
    return p is not None and p.state != "Z" and (start is None or p.start == start)


def descendants(roots: Iterable[int], tab: Dict[int, Proc]) -> Set[int]:
    """The roots that exist and everything below them."""
    children: Dict[int, list] = {}
    for p in tab.values():
        children.setdefault(p.ppid, []).append(p.pid)
    out: Set[int] = set()
    todo = [r for r in roots if r in tab]
    while todo:
        pid = todo.pop()
        if pid in out:
            continue
        out.add(pid)
        todo.extend(children.get(pid, ()))
    return out


def _proc_kb(pid: int, file: str, key: str) -> int:
    """The `key: N kB` line of /proc/<pid>/<file>, in bytes; 0 once the process is gone."""
    try:
        with open(f"/proc/{pid}/{file}") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        pass
    return 0


def pss_bytes(pid: int) -> int:
    """The process's proportional share of memory (pages shared after a fork count once in all)."""
    return _proc_kb(pid, "smaps_rollup", "Pss")


def rss_bytes(pid: int) -> int:
    """The process's resident memory (cheap to read: what the watch loop polls between tree sums)."""
    return _proc_kb(pid, "status", "VmRSS")


def tree_memory(roots: Iterable[int]) -> int:
    """Memory used by `roots` and everything below them, in bytes."""
    return sum(pss_bytes(pid) for pid in descendants(roots, table()))


def marked(pid: int, judge: Optional[int] = None) -> bool:
    """Whether the process was started by the judge process `judge` (default: this one): its
    environment carries MARKER set to that judge's pid."""
    tag = f"{MARKER}={os.getpid() if judge is None else judge}".encode()
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return tag in f.read().split(b"\0")
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return False


def kill_tree(roots: Dict[int, Optional[int]], strays=None, passes: int = 400) -> None:
    """SIGKILL `roots` ({pid: start time or None}) with all their descendants, plus whatever
    `strays(table)` names on each pass, until nothing is left; reap those that are our children.
    This process is never killed: `{os.getpid(): None}` is everything below it, looked up afresh on each pass."""
    me = os.getpid()
    quiet = 0  # passes in a row that found nothing left
    for _ in range(passes):
        tab = table()
        live_roots = [pid for pid, start in roots.items() if pid in tab and (start is None or tab[pid].start == start)]
        targets = descendants(live_roots + sorted(strays(tab) if strays else ()), tab)
        targets.discard(me)
        pending = [pid for pid in targets if tab[pid].state != "Z"]
        # the roots (subreapers: a keeper) go last, so what dies below them is adopted by them,
        # still in reach, and never by a process whose orphans are told apart by a marker
        below = [pid for pid in pending if pid not in roots]
        for pid in pending:  # stopped first: a root that forks on (a shell's loop) would always have some below it
            _signal(pid, signal.SIGSTOP)
        for pid in targets:
            if tab[pid].state != "Z" and (pid not in roots or not below):
                _signal(pid, signal.SIGKILL)
            if tab[pid].ppid == me:
                reap(pid)
        quiet = 0 if pending else quiet + 1
        if quiet == 2:  # a second look: one forked during a look, by a process that then ended, is not in it
            return
        time.sleep(0.005)


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def reap(pid: int) -> None:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass
