"""Give each worker its own process, network and mount namespaces (Linux), where the kernel lets us.

The keeper makes a new pid namespace before it forks the worker, so the worker is that
namespace's first process (its pid 1) and everything the learner's code starts is inside it:
- when the worker ends, the kernel kills everything left in the namespace, however it was forked,
  double-forked or detached, so nothing outlives the worker;
- the learner's code sees and can signal only its own processes: the judge, the fork server, the
  keepers, the reference's worker and other learners' workers have no pid in its namespace.
The worker then makes its own network namespace (a loopback that is down, and nothing else: no
TCP, no UDP, no reaching a local server) and mount namespace, where /proc is mounted again to show
only its own processes.

Root makes these directly; an ordinary user first makes a user namespace in which it is root
(where the kernel allows unprivileged user namespaces). Where the kernel refuses (a container's
seccomp profile often does), `available()` is False and the judge says so (`judge.confinement`).
"""

from __future__ import annotations

import ctypes
import functools
import os
import subprocess
import sys
from typing import Optional

REFUSED = "MINISGL_JUDGE_NAMESPACES_REFUSED"  # set in a worker whose namespaces were refused: why
CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x00020000, 0x10000000, 0x20000000, 0x40000000
_MS_NOSUID, _MS_NODEV, _MS_NOEXEC, _MS_REC, _MS_PRIVATE = 2, 4, 8, 1 << 14, 1 << 18


def _libc():
    return ctypes.CDLL(None, use_errno=True)


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def new_pid_namespace() -> Optional[str]:
    """In the keeper: the next child it forks starts a new pid namespace (and, for an ordinary
    user, a user namespace where it is root). Returns None, or why the kernel refused."""
    if not sys.platform.startswith("linux"):
        return f"no namespaces on {sys.platform}"
    libc = _libc()
    if os.geteuid() != 0:
        uid, gid = os.geteuid(), os.getegid()
        if libc.unshare(CLONE_NEWUSER) != 0:
            return f"unshare(CLONE_NEWUSER) was refused (errno {ctypes.get_errno()})"
        try:  # the same ids inside as outside: files keep their owners
            _write("/proc/self/setgroups", "deny")
            _write("/proc/self/uid_map", f"{uid} {uid} 1")
            _write("/proc/self/gid_map", f"{gid} {gid} 1")
        except OSError as exc:
            return f"the user namespace's ids could not be mapped ({exc})"
    if libc.unshare(CLONE_NEWPID) != 0:
        return f"unshare(CLONE_NEWPID) was refused (errno {ctypes.get_errno()})"
    return None


def isolate() -> Optional[str]:
    """In the worker (the first process of its pid namespace): a network and a mount namespace of
    its own, with /proc showing only its namespace. Returns None, or why it could not be done."""
    libc = _libc()
    if libc.unshare(CLONE_NEWNS | CLONE_NEWNET) != 0:
        return f"unshare(CLONE_NEWNS | CLONE_NEWNET) was refused (errno {ctypes.get_errno()})"
    # our mounts stay ours: nothing mounted here shows up outside
    if libc.mount(None, b"/", None, ctypes.c_ulong(_MS_REC | _MS_PRIVATE), None) != 0:
        return f"the mounts could not be made private (errno {ctypes.get_errno()})"
    if libc.mount(b"proc", b"/proc", b"proc", ctypes.c_ulong(_MS_NOSUID | _MS_NODEV | _MS_NOEXEC), None) != 0:
        return f"/proc could not be mounted for the worker's namespace (errno {ctypes.get_errno()})"
    return None


def _probe() -> int:
    """Make the namespaces as a keeper and its worker would; exit status 0 if all went through."""
    why = new_pid_namespace()
    if why is not None:
        print(why)
        return 1
    pid = os.fork()
    if pid == 0:
        why = isolate()
        if why is not None:
            print(why, flush=True)
        os._exit(0 if why is None and os.getpid() == 1 and os.listdir("/proc").count("1") == 1 else 1)
    _, status = os.waitpid(pid, 0)
    return 0 if os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0 else 1


@functools.lru_cache(maxsize=None)
def why_not() -> Optional[str]:
    """None where workers can have their namespaces on this machine, else why not (tried once, in
    a small process of its own: a namespace, once made, cannot be left)."""
    if not sys.platform.startswith("linux"):
        return f"no namespaces on {sys.platform}"
    try:
        # this file run as a script: the judge package (torch) is not imported for it
        proc = subprocess.run([sys.executable, os.path.abspath(__file__)], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"the namespace probe did not run ({exc})"
    return None if proc.returncode == 0 else (proc.stdout.strip() or proc.stderr.strip()[-300:] or "the kernel refused")


def available() -> bool:
    return why_not() is None


if __name__ == "__main__":
    sys.exit(_probe())
