"""Grade one file against one exercise: plan the cases, run the reference and the learner's piece
side by side in subprocesses, and turn the two sets of observations into verdicts."""

from __future__ import annotations

import json
import os
import random
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Tuple

from . import confinement, integrity, progress, reference, registry, sandbox, speed
from .api import HIDDEN_PREFIX, Exercise
from .compare import first_difference
from .result import CaseResult, GradeResult, Status
from .runner import CaseJob, WorkerReport, cancel_all, reset_cancel, run_cases, sweep


def cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def current_fingerprint() -> Dict[str, str]:
    from .worker import fingerprint

    return fingerprint()


def plan(ex: Exercise, seed: Optional[int] = None) -> List[CaseJob]:
    """Every fixed case once, every seeded case with fresh seeds (reproducible with `seed`) or with
    the seeds it fixes."""
    rng = random.Random(seed) if seed is not None else random.SystemRandom()
    jobs: List[CaseJob] = []
    for case in ex.cases:
        timeout = ex.timeout_for(case)
        if case.seeds:
            for s in case.seed_list(rng):
                jobs.append(CaseJob(f"{case.key}#{s}", case.key, s, timeout))
        else:
            jobs.append(CaseJob(case.key, case.key, None, timeout))
    return jobs


def default_threads(parallel: int) -> int:
    return max(1, (os.cpu_count() or 2) // max(parallel, 1))


@dataclass
class Settings:
    """How workers run: the same for the reference and for the file being graded."""

    memory_limit_gb: float
    threads: int
    use_cuda: bool
    cases_dir: Optional[Path] = None  # an instructor's hidden cases, loaded by every worker
    protect: Tuple[Path, ...] = ()  # folders the graded code may not open: the class's submissions, the outputs

    def kw(self) -> Dict[str, Any]:
        return dict(memory_limit_gb=self.memory_limit_gb, threads=self.threads, use_cuda=self.use_cuda, cases_dir=self.cases_dir,
                    sandbox={"no_access": [str(p) for p in self.protect]})


@dataclass
class Expected:
    """What each case is compared with: the reference's observations per case id, or why there
    are none (the reference itself failed the case: a bug in the exercise)."""

    obs: Dict[str, List[Dict[str, Any]]] = field(default_factory=dict)
    broken: Dict[str, str] = field(default_factory=dict)


# ---- the one path grade() and check share ----------------------------------------------------------
def run_reference(ex: Exercise, jobs: List[CaseJob], settings: Settings) -> WorkerReport:
    """The reference engine (nothing installed) on `jobs`."""
    return run_cases(ex.id, None, jobs, **settings.kw())


def expected_from(jobs: List[CaseJob], ref: WorkerReport, recorded: Optional[Dict[str, List[Dict[str, Any]]]] = None) -> Expected:
    """Expected observations: `recorded` ones (by case key) for the fixed cases it has, the
    reference run's for the rest."""
    exp = Expected()
    for job in jobs:
        if job.seed is None and recorded is not None and job.key in recorded:
            exp.obs[job.id] = recorded[job.key]
            continue
        r = ref.results.get(job.id)
        if r is not None and r.get("completed"):
            exp.obs[job.id] = r["obs"]
        else:
            exp.broken[job.id] = ref.fatal["error"] if ref.fatal else (r or {}).get("error", "no reference output")
    return exp


def run_file(ex: Exercise, file: Path, jobs: List[CaseJob], settings: Settings, stop_at_first_failure: Optional[Expected] = None) -> WorkerReport:
    """The file's piece transplanted into the engine, on `jobs`; with `stop_at_first_failure`,
    the run ends at the first case that does not pass against it (the rest are NOT_RUN).

    The public cases run in workers that never load the hidden ones, and the hidden cases in
    workers of their own: what the graded code finds in its process's memory (a hidden case's
    constants) can show only in the hidden cases' own verdicts."""
    on_done = None
    if stop_at_first_failure is not None:
        expected = stop_at_first_failure

        def on_done(case_id: str, event: Dict[str, Any]) -> bool:
            return decide(event, expected.obs.get(case_id))[0] is not Status.PASS

    public = [j for j in jobs if not j.key.startswith(HIDDEN_PREFIX)]
    hidden = [j for j in jobs if j.key.startswith(HIDDEN_PREFIX)]
    report = run_cases(ex.id, file, public, on_done=on_done, **dict(settings.kw(), cases_dir=None))
    if not hidden or report.fatal is not None or len(report.results) < len(public):
        return report  # nothing hidden, or the file could not be graded, or the run stopped early
    more = run_cases(ex.id, file, hidden, on_done=on_done, **settings.kw())
    report.results.update(more.results)
    if more.fatal is not None:  # it loaded for the public cases: the hidden ones say why they did not run
        for j in hidden:
            report.results.setdefault(j.id, {"completed": False, "status": more.fatal["status"], "error": more.fatal["error"],
                                             "obs": [], "seconds": 0.0})
    return report


def decide(event: Optional[Dict[str, Any]], expected: Optional[List[Dict[str, Any]]]):
    """The verdict of one case run against its expected observations: (Status, Difference or None).
    The one place a verdict is decided."""
    if event is None:
        return Status.NOT_RUN, None
    if not event.get("completed"):
        partial = event.get("obs", [])
        diff = first_difference(partial, expected[: len(partial)]) if partial and expected is not None else None
        return Status(event["status"]), diff
    if expected is None:
        return Status.ERROR, None
    diff = first_difference(event["obs"], expected)
    return (Status.PASS if diff is None else Status.FAIL), diff


POINT_DIGITS = 6  # points are reported to a millionth; the shares of a case add up to its weight exactly at that precision


def point_shares(weight: float, n: int) -> List[float]:
    """`weight` shared by `n` runs (a seeded case's seeds), rounded so that the shares add up to
    `weight` itself: the last share takes what rounding the others left over."""
    if n <= 0:
        return []
    share = round(weight / n, POINT_DIGITS)
    return [share] * (n - 1) + [round(weight - share * (n - 1), POINT_DIGITS)]


def verdicts(ex: Exercise, jobs: List[CaseJob], expected: Expected, got: WorkerReport) -> List[CaseResult]:
    by_key = {c.key: c for c in ex.cases}
    shares = {k: point_shares(ex.weight_of(c), sum(j.key == k for j in jobs)) for k, c in by_key.items()}
    out: List[CaseResult] = []
    for i, job in enumerate(jobs):
        case = by_key[job.key]
        name = case.name + (f" (seed {job.seed})" if job.seed is not None else "")
        base = dict(name=name, kind=case.kind, hint=case.hint, seed=job.seed, key=case.key, hidden=case.hidden,
                    weight=shares[job.key].pop(0) if shares[job.key] else 0.0)  # a seeded case's points, shared by its seeds
        if got.fatal is not None:
            status = Status(got.fatal["status"]) if i == 0 else Status.NOT_RUN
            msg = got.fatal["error"] if i == 0 else "not run: your file could not be graded (see the first case)"
            out.append(CaseResult(status=status, message=msg, **base))
            continue
        if job.id in expected.broken:
            out.append(CaseResult(status=Status.ERROR, message=f"the reference failed this case, a bug in the exercise, not in your code:\n{expected.broken[job.id]}", **base))
            continue
        event = got.results.get(job.id)
        try:
            status, diff = decide(event, expected.obs.get(job.id))
        except (TypeError, ValueError, KeyError, AttributeError, IndexError) as exc:  # observations of an unexpected shape
            out.append(CaseResult(status=Status.ERROR, message=f"the observations this case sent could not be compared ({type(exc).__name__}: {exc})", **base))
            continue
        if event is None:
            out.append(CaseResult(status=status, message="not run (grading stopped early)", **base))
            continue
        seconds = event.get("seconds", 0.0)
        extra: Dict[str, str] = {}
        if diff is not None:
            extra = dict(where=diff.where, got=diff.got, expected=diff.expected)
        elif status is not Status.PASS and event.get("obs"):  # it went wrong after everything it recorded matched
            extra = dict(where=f"after '{event['obs'][-1]['label']}' (everything recorded up to there matched)")
        message = event.get("error", "") if status not in (Status.PASS, Status.FAIL) else (diff.detail if diff else "")
        if status is not Status.PASS:
            message += _printed(event)
        out.append(CaseResult(status=status, message=message.strip("\n"), seconds=seconds, **base, **extra))
    return out


def _printed(event: Dict[str, Any]) -> str:
    text = (event.get("printed") or "").rstrip()
    return f"\nyour code printed:\n{text}" if text else ""


def timing(ex: Exercise, file: Path, settings: Settings, device: str) -> List[str]:
    """After a passing grade, on a hot-path exercise: the piece's time against the engine's."""
    if not ex.timed:
        return []
    jobs = [CaseJob(c.key, c.key, None, ex.timeout_for(c)) for c in ex.cases_for_timing()]
    report = run_cases(ex.id, file, jobs, speed=True, **dict(settings.kw(), cases_dir=None))  # public cases only
    if report.timings is None:
        why = (report.fatal or {}).get("error", "no timings came back")
        return [f"not timed: {why.splitlines()[0]}"]
    lines = [speed.describe(q, t, device) for q, t in report.timings.items()]
    busy = speed.busy_machine()
    return lines + ([busy] if busy else [])


def _recorded(exercise_id: str, snap: integrity.Snapshot, dirty: List[str], warnings: List[str]) -> Optional[Dict[str, Any]]:
    """The recorded reference as read before any learner code ran; its committed version if the
    file on disk differs from it."""
    rel = str(reference.path_for(exercise_id).relative_to(registry.REPO_ROOT))
    text = snap.files.get(rel)
    if rel in dirty:
        committed = integrity.committed_text(rel)
        if committed is not None:
            warnings.append(f"{rel} differs from its committed version: graded against the committed one")
            text = committed
    return json.loads(text) if text is not None else None


def _put_back(snap: integrity.Snapshot, warnings: List[str]) -> bool:
    """Put back the watched files the graded code changed; True if it changed any. Where the
    worker is confined (`judge.sandbox`) the graded code cannot write them, so a change is someone
    else's edit: it is named, and kept."""
    changes = snap.changes()
    if not changes:
        return False
    if sandbox.available():
        warnings.append("files the judge grades with changed during this grading (not by the graded code, which cannot write "
                        "them): " + ", ".join(map(str, changes)) + ". Grade again once they are settled.")
        snap.retake()  # the new versions are the ones to compare with from here on
        return False
    snap.restore(changes)
    warnings.append("the graded code changed files the judge grades with: " + ", ".join(map(str, changes))
                    + ". The judge put them back as they were and graded with what it had read before the code ran.")
    return True


@dataclass
class Grading:
    """What every file graded on one exercise is compared with, prepared before any learner code
    runs: the cases planned, the recorded reference (where it applies here), the notes."""

    ex: Exercise
    jobs: List[CaseJob]
    settings: Settings
    fingerprint: Dict[str, str]
    snap: integrity.Snapshot
    recorded: Optional[Dict[str, Any]]
    use_recorded: bool
    notes: List[str] = field(default_factory=list)
    warnings: List[str] = field(default_factory=list)
    instructor_notes: List[str] = field(default_factory=list)  # about the hidden cases: not for learners' eyes before publication

    @property
    def ref_jobs(self) -> List[CaseJob]:
        """The cases the reference engine runs now: seeded and hidden ones, and every case where
        the recording does not apply."""
        return [j for j in self.jobs if j.seed is not None or j.key.startswith(HIDDEN_PREFIX) or not self.use_recorded]

    def expected(self, ref: WorkerReport) -> Expected:
        return expected_from(self.jobs, ref, self.recorded["cases"] if self.use_recorded else None)

    def reference(self) -> Expected:
        """Run the reference (once more, alone, for any case whose reference run was lost) and
        return what each case is compared with."""
        ref = run_reference(self.ex, self.ref_jobs, self.settings) if self.ref_jobs else WorkerReport()
        return self.settle(ref)

    def settle(self, ref: WorkerReport) -> Expected:
        expected = self.expected(ref)
        if expected.broken:  # the graded code may have killed the reference's worker: once more, alone
            sweep()
            again = [j for j in self.ref_jobs if j.id in expected.broken]
            rerun = run_reference(self.ex, again, self.settings)
            ref.results.update({k: v for k, v in rerun.results.items() if v.get("completed")})
            ref.fatal = ref.fatal if rerun.fatal else None
            expected = self.expected(ref)
        return expected

    def result(self, display: str, expected: Expected, got: WorkerReport, warnings: Optional[List[str]] = None) -> GradeResult:
        notes = list(self.notes)
        if got.skipped:
            notes.append("optional helpers you did not write (the engine's are hidden too): " + ", ".join(got.skipped))
        return GradeResult(self.ex.id, display, self.fingerprint["device"], verdicts(self.ex, self.jobs, expected, got), notes,
                           warnings=list(self.warnings) + list(warnings or []), instructor_notes=list(self.instructor_notes))


def prepare(exercise_id: str, *, seed: Optional[int] = None, timeout_scale: float = 1.0, memory_limit_gb: Optional[float] = None,
            cases_dir: Optional[str | Path] = None, parallel: int = 2, protect: Iterable[str | Path] = ()) -> Grading:
    """Everything a grading of `exercise_id` needs before it runs a file (see `Grading`)."""
    cases_dir = Path(cases_dir).expanduser().resolve() if cases_dir is not None else None
    protect = [Path(p).expanduser().resolve() for p in protect]
    ex = registry.load(exercise_id, cases_dir)
    snap = integrity.Snapshot()  # before any learner code runs
    dirty = integrity.differs_from_git(snap, integrity.committed_ids())
    jobs = plan(ex, seed)
    for j in jobs:
        j.timeout_s *= timeout_scale
    use_cuda = cuda_available()
    fp = current_fingerprint()
    notes = [f"graded on {fp['device']}" + ("" if use_cuda else " (no GPU found: everything runs on the CPU)")]
    warnings: List[str] = []
    recorded = _recorded(exercise_id, snap, dirty, warnings)
    others = [d for d in dirty if d != str(reference.path_for(exercise_id).relative_to(registry.REPO_ROOT))]
    grading = [d for d in others if d.startswith("judge") or d in (f"exercises/{exercise_id}/cases.py", f"exercises/{exercise_id}/exercise.toml")]
    if grading:
        warnings.append("the judge's files differ from their committed versions (`git diff` shows how), so this verdict "
                        "may not mean what it says: " + ", ".join(grading[:8]) + (" ..." if len(grading) > 8 else ""))
    if len(others) > len(grading):
        engine = [d for d in others if d not in grading]
        notes.append("engine files that differ from their committed versions: " + ", ".join(engine[:8]) + (" ..." if len(engine) > 8 else ""))
    fixed_keys = [j.key for j in jobs if j.seed is None and not j.key.startswith(HIDDEN_PREFIX)]
    use_recorded = reference.usable(recorded, fp, fixed_keys)
    if use_recorded:
        notes.append("fixed cases compared with the recorded reference outputs; seeded cases with the reference run now")
    elif recorded is None:
        notes.append("no recorded reference outputs: the reference ran on this machine")
    else:
        what = reference.differences(recorded.get("fingerprint", {}), fp) or ["cases missing from the recording"]
        notes.append(f"the recorded reference outputs do not apply here ({'; '.join(what)}), so the reference was recomputed on this machine")
    if not sandbox.available():
        notes.append("this kernel has no Landlock, so the graded code runs unconfined: the judge puts back whatever it changes, "
                     "but could not keep it from reading the recorded references")
    gaps = [g.name for g in confinement.missing() if g.name != "files"]  # files: the note above
    if gaps:
        notes.append(f"this machine lacks part of the sandbox ({', '.join(gaps)}): `python judge.py sandbox` says what the graded code could do")
    instructor_notes = []
    if cases_dir is not None:
        hidden = sum(c.hidden for c in ex.cases)
        instructor_notes.append(f"{hidden} hidden case{'s' if hidden != 1 else ''} from {cases_dir}, their reference run on this machine")
    settings = Settings(memory_limit_gb or ex.memory_limit_gb, default_threads(parallel), use_cuda, cases_dir, tuple(protect))
    return Grading(ex, jobs, settings, fp, snap, recorded, use_recorded, notes, warnings, instructor_notes)


def grade(
    exercise_id: str,
    path: Optional[str | Path] = None,
    *,
    seed: Optional[int] = None,
    save: bool = True,
    timeout_scale: float = 1.0,
    memory_limit_gb: Optional[float] = None,
    cases_dir: Optional[str | Path] = None,
    protect: Iterable[str | Path] = (),
) -> GradeResult:
    """Grade `path` (default: work/<id>.py) on exercise `exercise_id`; returns a GradeResult.

    The reference and the learner's piece each run in a subprocess, in parallel. Seeded cases get
    fresh seeds unless `seed` fixes them. `timeout_scale` and `memory_limit_gb` adjust the limits
    (for slow machines, or tests of the limits themselves). `cases_dir`: an instructor's folder
    of hidden cases (`<dir>/<id>/cases.py`), graded beside the public ones. `protect`: folders the
    graded code may not open (where the results go, other submissions)."""
    registry.folder(exercise_id)  # an unknown id says so first
    file = Path(path) if path is not None else registry.learner_path(exercise_id)
    if not file.is_file():
        raise FileNotFoundError(f"{file} does not exist: run `python judge.py start {exercise_id}` to get the starter there")
    file = file.resolve()
    record_before = progress.snapshot()  # the learner's record, which graded code must not change
    g = prepare(exercise_id, seed=seed, timeout_scale=timeout_scale, memory_limit_gb=memory_limit_gb, cases_dir=cases_dir,
                protect=protect)
    warnings: List[str] = []
    reset_cancel()
    try:
        with ThreadPoolExecutor(2) as pool:
            try:
                ref_future = pool.submit(run_reference, g.ex, g.ref_jobs, g.settings) if g.ref_jobs else None
                got = pool.submit(run_file, g.ex, file, g.jobs, g.settings).result()
                ref = ref_future.result() if ref_future else WorkerReport()
            except KeyboardInterrupt:
                cancel_all()  # end the subprocesses, or the pool would wait for them
                raise
        if _put_back(g.snap, warnings) and g.ref_jobs:
            ref = run_reference(g.ex, g.ref_jobs, g.settings)  # it ran while the files were changed: run it again
        result = g.result(_display(file), g.settle(ref), got, warnings)
        if result.ok:
            result.speed = timing(g.ex, file, g.settings, g.fingerprint["device"])
            _put_back(g.snap, result.warnings)
    finally:
        sweep()
        _put_back(g.snap, warnings)
        if not sandbox.available() and progress.restore(record_before):  # confined code cannot write it
            warnings.append(f"the graded code changed your progress record ({progress.path().name}); the judge put it back")
    for w in warnings:
        if w not in result.warnings:
            result.warnings.append(w)
    if save:
        progress.record(result)
    return result


def _display(file: Path) -> str:
    try:
        return str(file.relative_to(registry.REPO_ROOT))
    except ValueError:
        return str(file)
