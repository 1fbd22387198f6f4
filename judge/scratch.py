"""The judge's private folders: where its workers' control files and the learners' copies live.

Every folder here is made by the judge process, with an unpredictable name and mode 0700, under
one folder of its own (`base()`). A worker that runs a learner's file may open nothing under that
folder but its own scratch folder (`judge.sandbox`), so it cannot read or plant files where the
judge, the reference run or another learner's worker reads and writes: job files, event files,
pid files and private copies of submissions all live out of its reach.

    run = new_run()        # run.control: the judge's files; run.scratch: the worker's TMPDIR
    private = private_dir("batch")
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional

_LOCK = threading.Lock()
_BASE: Optional[Path] = None
_OWNER: Optional[int] = None  # the pid that made the folder (a forked child must not remove it)


def base() -> Path:
    """This judge process's private folder (made on first use, removed at exit)."""
    global _BASE, _OWNER
    with _LOCK:
        if _BASE is None or _OWNER != os.getpid() or not _BASE.is_dir():
            _BASE = Path(tempfile.mkdtemp(prefix="minisgl-judge-")).resolve()  # mkdtemp: 0700, a fresh name
            _OWNER = os.getpid()
            atexit.register(_remove, _BASE, _OWNER)
        return _BASE


def _remove(folder: Path, owner: int) -> None:
    if os.getpid() == owner:
        shutil.rmtree(folder, ignore_errors=True)


def private_dir(prefix: str) -> Path:
    """A new folder of the judge's own, under `base()`."""
    return Path(tempfile.mkdtemp(prefix=f"{prefix}-", dir=base()))


@dataclass(frozen=True)
class Run:
    control: Path  # job, event, stderr and pid files: written by the judge and its keepers only
    scratch: Path  # the worker's TMPDIR, the one folder under base() its learner code may open

    def remove(self) -> None:
        shutil.rmtree(self.control, ignore_errors=True)


def new_run() -> Run:
    control = private_dir("run")
    scratch = control / "scratch"
    scratch.mkdir(mode=0o700)
    return Run(control, scratch)


@contextlib.contextmanager
def run_folders() -> Iterator[Run]:
    """A new `Run`, removed (without following any link planted in it) when the block ends."""
    run = new_run()
    try:
        yield run
    finally:
        run.remove()
