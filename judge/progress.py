"""The judge's record of the learner's gradings (.judge/results.json, or results.json in the folder
that JUDGE_STATE_DIR names: see `registry.STATE_DIR`): per exercise the latest result and the best
one, which `judge.py list` and the index notebook both read.

Only the judge writes it. The graded code runs where it cannot write the repository (see
`judge.sandbox`), and wherever that sandbox is not available the judge takes the record's bytes
before a grading and puts them back after it (`snapshot`, `restore`) before adding its own line.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Dict, Iterator, Optional

from . import registry
from .files import write_whole
from .result import GradeResult


@dataclass(frozen=True)
class Attempt:
    passed: int
    total: int
    file: str  # "work/req-lengths.py" or "this cell"
    when: str  # "2026-12-01 09:30", local time

    @property
    def ok(self) -> bool:
        return self.total > 0 and self.passed == self.total

    def rank(self) -> tuple:
        return (self.ok, self.passed / self.total if self.total else 0.0, self.passed)

    def __str__(self) -> str:
        return f"{self.passed}/{self.total} ({self.when})"


@dataclass(frozen=True)
class Progress:
    best: Attempt
    latest: Attempt

    def __str__(self) -> str:
        if self.latest == self.best:
            return str(self.best)
        return f"best {self.best}, latest {self.latest}"


def path() -> Path:
    return registry.STATE_DIR / "results.json"


def snapshot() -> Optional[bytes]:
    """The record's bytes now (None: there is no record yet)."""
    try:
        return path().read_bytes()
    except FileNotFoundError:
        return None


def restore(before: Optional[bytes]) -> bool:
    """Put the record back as `snapshot` found it; True if something else had changed it."""
    now = snapshot()
    if now == before:
        return False
    if before is None:
        path().unlink(missing_ok=True)
    else:
        write_whole(path(), before)  # a link planted in its place is replaced, not written through
    return True


def _attempt(raw: dict) -> Attempt:
    return Attempt(int(raw["passed"]), int(raw["total"]), str(raw.get("file", "")), str(raw.get("when", "")))


def load() -> Dict[str, Progress]:
    """Every exercise graded so far. A missing or unreadable record reads as no gradings yet."""
    try:
        state = json.loads(path().read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}
    out: Dict[str, Progress] = {}
    for ex_id, raw in state.items():
        try:
            if "latest" in raw:
                out[ex_id] = Progress(best=_attempt(raw["best"]), latest=_attempt(raw["latest"]))
            else:  # the record's first layout kept only the last result
                out[ex_id] = Progress(best=_attempt(raw), latest=_attempt(raw))
        except (KeyError, TypeError, ValueError):
            continue  # a hand-edited entry that makes no sense is ignored, not fatal
    return out


def record(result: GradeResult, when: Optional[str] = None) -> Progress:
    """Add one grading: it becomes the latest, and the best unless an earlier one passed more."""
    now = Attempt(result.passed, result.total, result.file, when or time.strftime("%Y-%m-%d %H:%M"))
    target = path()
    target.parent.mkdir(parents=True, exist_ok=True)
    with _locked(target.with_suffix(".lock")):  # two notebooks grading at once: neither loses the other's
        state = load()
        old = state.get(result.exercise)
        best = now if old is None or now.rank() >= old.best.rank() else old.best
        state[result.exercise] = Progress(best=best, latest=now)
        # a grading killed mid-write never leaves half a record
        write_whole(target, json.dumps({k: asdict(v) for k, v in state.items()}, indent=1, sort_keys=True))
    return state[result.exercise]


@contextlib.contextmanager
def _locked(lock_path: Path) -> Iterator[None]:
    """Hold an exclusive lock on `lock_path` (a file that stays) while the block runs."""
    with open(lock_path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)  # released when the file closes, or the process dies
        yield
