"""Grade a class: one answer per learner folder, each in its own sandboxed workers, against one
reference run, into one gradebook (`judge.gradebook`).

    python judge.py grade-all SUBMISSIONS --exercise prefill-adder --jobs 4 --out grades/

SUBMISSIONS holds one folder per learner with `<id>.py` or a notebook whose `%%judge <id>` cell
is the answer (`judge.submission`). The cases (and their seeds) are planned once and the reference
runs once, before any learner's code, so every learner is graded on the same cases. Each answer
runs in its own worker processes under the usual limits (`judge.runner`): a crash, an endless
loop, a fork bomb or a huge allocation ends that learner's case, nobody else's. The graded code
cannot open SUBMISSIONS, the output folder, or the judge's private copies of other answers.

Each learner is recorded as they finish (`judge.ledger`); Ctrl-C ends the running workers at once
and the gradebook is written with what was graded; `--resume` grades the rest, `--only` regrades
some learners and merges them with the record.
"""

from __future__ import annotations

import shutil
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Callable, Dict, Iterable, List, Optional, Union

from . import confinement, progress, registry, sandbox, scratch, submission
from .files import create_new
from .grade import Grading, _put_back, prepare, run_file
from .gradebook import Batch, LearnerGrade, display
from .ledger import Ledger
from .result import GradeResult
from .runner import cancel_all, cancelled, reset_cancel, sweep

_SNAP_LOCK = threading.Lock()  # learners finish in parallel; one compares and puts back the files at a time
WIDTH = 79  # a terminal's 80 columns, less the cursor's


class Bar:
    """A one-line progress bar on a terminal (never wider than 80 columns); a line per learner
    elsewhere (a log, a notebook)."""

    def __init__(self, total: int, stream=sys.stderr) -> None:
        self.total, self.done, self.stream, self.t0 = total, 0, stream, time.monotonic()
        self.tty = bool(getattr(stream, "isatty", lambda: False)())

    def step(self, what: str) -> None:
        self.done += 1
        elapsed = time.monotonic() - self.t0
        if self.tty:
            filled = int(20 * self.done / max(self.total, 1))
            head = f"[{'#' * filled}{'.' * (20 - filled)}] {self.done}/{self.total} {elapsed:.0f} s "
            room = max(WIDTH - len(head), 0)
            self.stream.write(f"\r{head}{what[:room]:<{room}}")
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


def _submissions(root: Path, exercise_id: str, roster: Optional[List[str]]) -> Dict[str, submission.Submission]:
    """Each learner's answer, by name: the folders, and the roster's names (in its order) first."""
    folders = {f.name: f for f in learner_folders(root)}
    found: Dict[str, submission.Submission] = {}
    for name in roster or []:
        found[name] = (submission.find(folders[name], exercise_id) if name in folders
                       else submission.Submission(name, reason=f"on the roster, but {root} has no folder {name}/"))
    for name, folder in folders.items():
        if name not in found:
            found[name] = submission.find(folder, exercise_id)
            if roster is not None:
                found[name].warnings.append(f"{name}: not on the roster")
    return found


def grade_all(root: Union[str, Path], exercise_id: str, *, out: Union[str, Path], jobs: int = 2, seed: Optional[int] = None,
              cases_dir: Optional[Union[str, Path]] = None, timeout_scale: float = 1.0, memory_limit_gb: Optional[float] = None,
              resume: bool = False, only: Optional[Iterable[str]] = None, roster: Optional[List[str]] = None,
              allow_weaker_sandbox: bool = False, stream=sys.stderr, echo: Callable[[str], None] = print) -> Batch:
    """Grade the learners in `root` on `exercise_id`, recording each in `out` as they finish (see
    the module's docstring). `resume`: skip learners already recorded there; `only`: grade these
    learners alone, the others' grades taken from the record. Ctrl-C returns the batch so far
    (`batch.interrupted`). On a machine that lacks a protection of the sandbox, raises
    `confinement.WeakSandboxError` unless `allow_weaker_sandbox`."""
    weaker = confinement.require(allow_weaker_sandbox)  # before anything is read or written
    registry.folder(exercise_id)
    root = Path(root).expanduser().resolve()
    out = Path(out).expanduser().resolve()
    found = _submissions(root, exercise_id, roster)
    only = set(only) if only is not None else None
    unknown = sorted((only or set()) - set(found))
    if unknown:
        raise FileNotFoundError(f"--only names learners with no folder in {root}: {', '.join(unknown)}")
    merging = resume or only is not None
    ledger = Ledger.open(out, exercise_id, seed, merge=merging)
    record_before = progress.snapshot()
    g = prepare(exercise_id, seed=ledger.seed, timeout_scale=timeout_scale, memory_limit_gb=memory_limit_gb, cases_dir=cases_dir,
                parallel=max(1, jobs), protect=[root, out])
    grades: Dict[str, LearnerGrade] = {}
    todo: List[str] = []
    for name, sub in found.items():
        recorded = ledger.load(name) if merging else None
        graded = recorded is not None and recorded.result is not None  # a record of "missing" is no grading
        if sub.found and (name in only if only is not None else not graded):
            grades[name] = LearnerGrade(name, sub, pending=True)
            todo.append(name)
        elif recorded is not None:
            grades[name] = recorded
        else:  # no answer (missing, unreadable); or, with --only, not chosen and never graded
            grades[name] = LearnerGrade(name, sub, pending=sub.found)
    t0 = time.monotonic()
    echo(f"{exercise_id}: {len(found)} learners ({len(todo)} to grade), {len(g.jobs)} cases (seed {ledger.seed}), "
         f"{max(1, jobs)} at a time on {g.fingerprint['device']}")
    for w in (w for sub in found.values() for w in sub.warnings):
        echo(f"warning: {w}")
    for w in weaker:
        echo(f"warning: {w}")
    batch = Batch(exercise_id, ledger.seed, root, g.fingerprint["device"], list(g.notes) + weaker + list(g.instructor_notes),
                  max_points=sum(g.ex.weight_of(c) for c in g.ex.cases))
    reset_cancel()
    expected = g.reference()  # once, before any learner's code runs
    if expected.broken:
        raise RuntimeError("the reference engine fails these cases, so nothing can be graded: "
                           + "; ".join(f"{k}: {v.splitlines()[0] if v else ''}" for k, v in expected.broken.items()))
    for name, lg in grades.items():
        if not lg.found.found:
            ledger.save(lg)  # nothing to grade: recorded as missing or unreadable
    copies = scratch.private_dir("batch")  # out of every graded file's reach but its own copy

    def one(name: str) -> Optional[str]:
        if cancelled():
            return None
        sub = found[name]
        file = copies / name / f"{exercise_id.replace('-', '_')}.py"
        file.parent.mkdir(mode=0o700)
        create_new(file, sub.source or "")
        started = time.monotonic()
        got = run_file(g.ex, file, g.jobs, g.settings)
        if cancelled():  # its workers were killed by the interrupt: no verdict to keep
            return None
        result = _grade_of(g, display(sub.path, root), expected, got, file)
        grades[name] = LearnerGrade(name, sub, result, time.monotonic() - started)
        ledger.save(grades[name])  # its processes are gone: the judge's own record of it
        return f"{name}: {result.passed}/{result.total}"

    bar = Bar(len(todo), stream)
    pool = ThreadPoolExecutor(max(1, jobs))
    try:
        futures = [pool.submit(one, n) for n in todo]
        for fut in as_completed(futures):
            what = fut.result()
            if what is not None:
                bar.step(what)
        pool.shutdown()
    except KeyboardInterrupt:
        cancel_all()  # every running worker ends now; the queued learners never start
        pool.shutdown(wait=True, cancel_futures=True)
        batch.interrupted = True
        stream.write("\ninterrupted: the gradebook holds the learners graded so far; `--resume` grades the rest\n")
    finally:
        sweep()
        shutil.rmtree(copies, ignore_errors=True)
        if not sandbox.available():
            progress.restore(record_before)
    batch.learners = list(grades.values())
    batch.seconds = time.monotonic() - t0
    return batch


def _grade_of(g: Grading, where: str, expected, got, file: Path) -> GradeResult:
    warnings: List[str] = []
    with _SNAP_LOCK:
        _put_back(g.snap, warnings)
    result = g.result(where, expected, got, warnings)
    for case in result.cases:  # messages that quote the private copy speak of the submission
        case.message = case.message.replace(str(file), where)
    return result
