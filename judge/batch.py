"""Grade a class: one answer per learner folder, each in its own sandboxed workers, against one
reference run, into one table.

    python judge.py grade-all SUBMISSIONS --exercise prefill-adder --jobs 4 --out grades/

SUBMISSIONS holds one folder per learner with `<id>.py` or a notebook whose `%%judge <id>` cell
is the answer (`judge.submission`). The cases (and their seeds) are planned once and the reference
runs once, before any learner's code, so every learner is graded on the same cases. Each answer
runs in its own worker processes under the usual limits (`judge.runner`): a crash, an endless
loop, a fork bomb or a huge allocation ends that learner's case, nobody else's. The table (CSV
and JSON) has a row per learner and case; a missing or unreadable answer is one row saying why.
"""

from __future__ import annotations

import csv
import json
import random
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional, Union

from . import formats, progress, registry, sandbox, submission
from .grade import Grading, _put_back, prepare, run_file
from .result import GradeResult
from .runner import cancel_all, reset_cancel, sweep

_SNAP_LOCK = threading.Lock()  # learners finish in parallel; one compares and puts back the files at a time
COLUMNS = ("learner", "exercise", "part", "case", "kind", "verdict", "score", "max_score", "seconds", "submission", "reason")


@dataclass
class Row:
    learner: str
    exercise: str
    part: str  # "public", "hidden", or "" for a submission that was not graded
    case: str
    kind: str
    verdict: str
    score: float
    max_score: float
    seconds: float
    submission: str
    reason: str = ""


@dataclass
class LearnerGrade:
    learner: str
    found: submission.Submission
    result: Optional[GradeResult] = None
    seconds: float = 0.0  # wall time of this learner's grading

    @property
    def verdict(self) -> str:
        if self.result is not None:
            return "graded"
        return "missing" if self.found.path is None else "unreadable"

    def rows(self, exercise: str, root: Path, max_points: float) -> List[Row]:
        where = _display(self.found.path, root)
        if self.result is None:
            return [Row(self.learner, exercise, "", "", "", self.verdict, 0.0, max_points, 0.0, where, self.found.reason)]
        out = []
        for c in self.result.cases:
            reason = "" if c.passed else (c.message.splitlines()[0] if c.message else c.where)
            out.append(Row(self.learner, exercise, "hidden" if c.hidden else "public", c.name, c.kind, str(c.status),
                           round(c.points, 6), round(c.weight, 6), round(c.seconds, 3), where, reason[:300]))
        return out


@dataclass
class Batch:
    exercise: str
    seed: int
    root: Path
    device: str
    notes: List[str]
    learners: List[LearnerGrade] = field(default_factory=list)
    max_points: float = 0.0
    seconds: float = 0.0

    def rows(self) -> List[Row]:
        return [r for g in self.learners for r in g.rows(self.exercise, self.root, self.max_points)]

    def summary(self) -> List[Dict[str, object]]:
        out = []
        for g in self.learners:
            r = g.result
            entry: Dict[str, object] = {"learner": g.learner, "verdict": g.verdict, "submission": _display(g.found.path, self.root),
                                        "reason": g.found.reason, "points": r.points if r else 0.0, "max_points": self.max_points,
                                        "seconds": round(g.seconds, 3)}
            if r is not None:
                for part, hidden in (("public", False), ("hidden", True)):
                    cases = r.part(hidden)
                    if cases:
                        entry[part] = f"{sum(c.passed for c in cases)}/{len(cases)}"
                entry["warnings"] = r.warnings
            out.append(entry)
        return out

    def write(self, out: Path, hidden_visibility: str = "after_published") -> Dict[str, Path]:
        """grades.csv and grades.json (the table), junit.xml, and gradescope/<learner>/results.json."""
        out.mkdir(parents=True, exist_ok=True)
        rows = self.rows()
        paths = {"csv": out / "grades.csv", "json": out / "grades.json", "junit": out / "junit.xml"}
        with open(paths["csv"], "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=COLUMNS)
            w.writeheader()
            w.writerows(asdict(r) for r in rows)
        paths["json"].write_text(json.dumps({
            "exercise": self.exercise, "seed": self.seed, "device": self.device, "notes": self.notes,
            "max_points": self.max_points, "learners": self.summary(), "rows": [asdict(r) for r in rows],
        }, indent=1) + "\n")
        suites: Dict[str, Union[GradeResult, str]] = {g.learner: g.result if g.result is not None else f"{g.verdict}: {g.found.reason}"
                                                      for g in self.learners}
        paths["junit"].write_text(formats.junit(suites, name=f"judge: {self.exercise}"))
        for g in self.learners:
            target = out / "gradescope" / g.learner / "results.json"
            target.parent.mkdir(parents=True, exist_ok=True)
            data = formats.gradescope(g.result, reason=g.found.reason, max_points=self.max_points, hidden_visibility=hidden_visibility)
            target.write_text(json.dumps(data, indent=1) + "\n")
        return paths


def _display(path: Optional[Path], root: Path) -> str:
    if path is None:
        return ""
    try:
        return str(path.resolve().relative_to(root.resolve()))
    except ValueError:
        return str(path)


class Bar:
    """A one-line progress bar on a terminal; a line per learner elsewhere (a log, a notebook)."""

    def __init__(self, total: int, stream=sys.stderr) -> None:
        self.total, self.done, self.stream, self.t0 = total, 0, stream, time.monotonic()
        self.tty = bool(getattr(stream, "isatty", lambda: False)())

    def step(self, what: str) -> None:
        self.done += 1
        elapsed = time.monotonic() - self.t0
        if self.tty:
            filled = int(30 * self.done / max(self.total, 1))
            self.stream.write(f"\r[{'#' * filled}{'.' * (30 - filled)}] {self.done}/{self.total}  {elapsed:.0f} s  {what[:60]:<60}")
            if self.done == self.total:
                self.stream.write("\n")
        else:
            self.stream.write(f"[{self.done}/{self.total}, {elapsed:.0f} s] {what}\n")
        self.stream.flush()


def learner_folders(root: Path) -> List[Path]:
    if not root.is_dir():
        raise FileNotFoundError(f"{root} is not a folder: grade-all takes a folder with one folder per learner")
    folders = sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not folders:
        raise FileNotFoundError(f"{root} has no learner folders (expected {root}/<learner>/<exercise-id>.py or a notebook)")
    return folders


def grade_all(root: Union[str, Path], exercise_id: str, *, jobs: int = 2, seed: Optional[int] = None,
              cases_dir: Optional[Union[str, Path]] = None, timeout_scale: float = 1.0, memory_limit_gb: Optional[float] = None,
              stream=sys.stderr, echo: Callable[[str], None] = print) -> Batch:
    """Grade every learner folder in `root` on `exercise_id` (see the module's docstring)."""
    registry.folder(exercise_id)
    root = Path(root).expanduser().resolve()
    folders = learner_folders(root)
    seed = seed if seed is not None else random.SystemRandom().randrange(1, 2**31)
    record_before = progress.snapshot()
    g = prepare(exercise_id, seed=seed, timeout_scale=timeout_scale, memory_limit_gb=memory_limit_gb, cases_dir=cases_dir,
                parallel=max(1, jobs))
    t0 = time.monotonic()
    echo(f"{exercise_id}: {len(folders)} learners, {len(g.jobs)} cases (seed {seed}), {max(1, jobs)} at a time on {g.fingerprint['device']}")
    reset_cancel()
    expected = g.reference()  # once, before any learner's code runs
    if expected.broken:
        raise RuntimeError("the reference engine fails these cases, so nothing can be graded: "
                           + "; ".join(f"{k}: {v.splitlines()[0] if v else ''}" for k, v in expected.broken.items()))
    batch = Batch(exercise_id, seed, root, g.fingerprint["device"], list(g.notes) + list(g.instructor_notes), max_points=sum(g.ex.weight_of(c) for c in g.ex.cases))
    found = {f.name: submission.find(f, exercise_id) for f in folders}
    grades = {name: LearnerGrade(name, sub) for name, sub in found.items()}
    bar = Bar(len(folders), stream)
    with tempfile.TemporaryDirectory(prefix="judge-batch-") as tmp:
        for name, sub in found.items():
            if not sub.found:
                bar.step(f"{name}: {grades[name].verdict}")

        def one(name: str) -> str:
            sub = found[name]
            file = Path(tmp) / name / f"{exercise_id.replace('-', '_')}.py"
            file.parent.mkdir(parents=True)
            file.write_text(sub.source)
            started = time.monotonic()
            got = run_file(g.ex, file, g.jobs, g.settings)
            result = _grade_of(g, _display(sub.path, root), expected, got, file)
            grades[name].result, grades[name].seconds = result, time.monotonic() - started
            return f"{name}: {result.passed}/{result.total}"

        todo = [n for n, s in found.items() if s.found]
        try:
            with ThreadPoolExecutor(max(1, jobs)) as pool:
                futures = [pool.submit(one, n) for n in todo]
                for fut in as_completed(futures):
                    bar.step(fut.result())
        except KeyboardInterrupt:
            cancel_all()
            raise
        finally:
            sweep()
            if not sandbox.available():
                progress.restore(record_before)
    batch.learners = [grades[f.name] for f in folders]
    batch.seconds = time.monotonic() - t0
    return batch


def _grade_of(g: Grading, display: str, expected, got, file: Path) -> GradeResult:
    warnings: List[str] = []
    with _SNAP_LOCK:
        _put_back(g.snap, warnings)
    result = g.result(display, expected, got, warnings)
    for case in result.cases:  # messages that quote the private copy speak of the submission
        case.message = case.message.replace(str(file), display)
    return result
