"""A hard cap on the tasks a worker may have (Linux cgroups' pids controller), where the judge may
make cgroups (root, or a delegated cgroup v2 subtree).

Each worker goes into a cgroup of its own, made by the judge, whose `pids.max` the worker cannot
raise: past it, the kernel refuses fork() and thread creation, so a fork bomb cannot take the
machine down, and the kernel counts each refusal (`pids.events`), so a fork bomb is always seen,
however fast its processes come and go. Where no such cgroup can be made, the judge counts
processes by looking (`runner.MAX_PROCS`), which a fast bomb may outrun between two looks.

The cap counts threads too (torch starts several): it is set well above the process limit.
"""

from __future__ import annotations

import errno
import functools
import os
import secrets
import time
from pathlib import Path
from typing import Optional

MAX_TASKS = 512  # processes and threads of one worker, all together
_swept = False


def _mounts():
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                left, _, right = line.partition(" - ")
                fields, more = left.split(), right.split()
                if len(fields) >= 5 and len(more) >= 3:
                    yield fields[4], more[0], more[2].split(",")
    except OSError:
        return


def _own(controller: str) -> Optional[str]:
    """This process's cgroup path in the hierarchy of `controller` ("" for cgroup v2)."""
    try:
        with open("/proc/self/cgroup") as f:
            for line in f:
                _, names, path = line.rstrip("\n").split(":", 2)
                if controller in names.split(","):
                    return path
    except (OSError, ValueError):
        pass
    return None


def _usable(folder: Path) -> bool:
    return (folder / "cgroup.procs").is_file() and os.access(folder, os.W_OK)


@functools.lru_cache(maxsize=None)
def root() -> Optional[Path]:
    """The cgroup under which the judge makes its workers' cgroups, or None where it can make none."""
    for mount, fstype, options in _mounts():  # cgroup v1, with a pids hierarchy of its own
        if fstype == "cgroup" and "pids" in options:
            own = _own("pids")
            folder = Path(mount) / (own or "/").lstrip("/")
            if own is not None and _usable(folder):
                return folder
    for mount, fstype, _ in _mounts():  # cgroup v2: our own cgroup's parent delegates pids to its children
        if fstype == "cgroup2":
            own = _own("")
            folder = Path(mount) / (own or "/").lstrip("/")
            if own is None or not _usable(folder):
                continue
            try:
                _delegate_pids(folder, own == "/")
                return folder
            except OSError:
                continue
    return None


LEAF = "minisgl-judge-leaf"  # where a container's processes move so that its cgroup may delegate


def _delegate_pids(folder: Path, container_root: bool) -> None:
    """Let `folder`'s child cgroups use the pids controller (OSError where that cannot be done).

    cgroup v2 hands a controller to children only while no process sits in the cgroup itself. In a
    container whose cgroup namespace root holds its processes (Gradescope's, docker's), they move
    into a leaf first, as container inits do. Elsewhere the judge moves nobody's processes."""
    control = folder / "cgroup.subtree_control"
    if "pids" in _read(control).split():
        return
    if "pids" not in _read(folder / "cgroup.controllers").split():
        raise OSError(errno.ENOENT, f"the pids controller is not given to {folder}")
    for _ in range(5):  # processes started meanwhile land in `folder` again: move them too
        try:
            _write(control, "+pids")
            return
        except OSError as exc:
            if exc.errno != errno.EBUSY or not container_root:
                raise
        _mkdir(folder / LEAF)
        for pid in _read(folder / "cgroup.procs").split():
            try:
                _write(folder / LEAF / "cgroup.procs", pid)
            except ProcessLookupError:
                pass  # ended meanwhile
    _write(control, "+pids")


def _read(path: Path) -> str:
    return path.read_text()


def _write(path: Path, text: str) -> None:
    with open(path, "w") as f:  # one write(2): cgroup files take one value per write
        f.write(text)


def _mkdir(path: Path) -> None:
    path.mkdir(exist_ok=True)


def available() -> bool:
    return root() is not None


def sweep() -> None:
    """Remove the empty cgroups of judges that are gone (one killed before it could)."""
    base = root()
    if base is None:
        return
    for folder in base.glob("minisgl-judge-*"):
        owner = folder.name.split("-")[2]
        if owner.isdigit() and not os.path.exists(f"/proc/{owner}"):
            remove(folder, wait_s=0)


def make() -> Optional[Path]:
    """A new cgroup capped at MAX_TASKS, or None where none can be made."""
    base = root()
    if base is None:
        return None
    global _swept
    if not _swept:
        _swept = True
        sweep()
    folder = base / f"minisgl-judge-{os.getpid()}-{secrets.token_hex(6)}"
    try:
        folder.mkdir()
        (folder / "pids.max").write_text(str(MAX_TASKS))
    except OSError:
        remove(folder)
        return None
    return folder


def enter(folder: str) -> Optional[str]:
    """Move this process into `folder` (what it starts from here on is in it too). None, or why not."""
    try:
        with open(os.path.join(folder, "cgroup.procs"), "w") as f:
            f.write("0")
    except OSError as exc:
        return f"could not enter the cgroup {folder} ({exc})"
    return None


def refused_forks(folder: Optional[Path]) -> int:
    """How many times the kernel refused a fork or a thread in `folder` for the cap."""
    try:
        for line in (folder / "pids.events").read_text().splitlines() if folder else ():
            key, _, value = line.partition(" ")
            if key == "max":
                return int(value)
    except (OSError, ValueError):
        pass
    return 0


def remove(folder: Optional[Path], wait_s: float = 2.0) -> None:
    """Remove the cgroup once its processes are gone (they leave it as they exit)."""
    if folder is None:
        return
    deadline = time.monotonic() + wait_s
    while True:
        try:
            folder.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            if time.monotonic() > deadline:
                return  # left behind, empty soon: harmless
            time.sleep(0.01)
