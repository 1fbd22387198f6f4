"""Grade one file against one exercise: plan the cases, run the reference and the learner's piece
side by side in subprocesses, and turn the two sets of observations into verdicts."""

from __future__ import annotations

import json
import os
import random
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional

from . import integrity, progress, reference, registry, speed
from .api import Exercise
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
    """Every fixed case once, every seeded case with fresh seeds (reproducible with `seed`)."""
    rng = random.Random(seed) if seed is not None else random.SystemRandom()
    jobs: List[CaseJob] = []
    for case in ex.cases:
        timeout = ex.timeout_for(case)
        if case.seeds:
            for _ in range(case.seeds):
                s = rng.randrange(1, 2**31)
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

    def kw(self) -> Dict[str, Any]:
        return dict(memory_limit_gb=self.memory_limit_gb, threads=self.threads, use_cuda=self.use_cuda)


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
    the run ends at the first case that does not pass against it (the rest are NOT_RUN)."""
    on_done = None
    if stop_at_first_failure is not None:
        expected = stop_at_first_failure

        def on_done(case_id: str, event: Dict[str, Any]) -> bool:
            return decide(event, expected.obs.get(case_id))[0] is not Status.PASS

    return run_cases(ex.id, file, jobs, on_done=on_done, **settings.kw())


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


def verdicts(ex: Exercise, jobs: List[CaseJob], expected: Expected, got: WorkerReport) -> List[CaseResult]:
    by_key = {c.key: c for c in ex.cases}
    out: List[CaseResult] = []
    for i, job in enumerate(jobs):
        case = by_key[job.key]
        name = case.name + (f" (seed {job.seed})" if job.seed is not None else "")
        base = dict(name=name, kind=case.kind, hint=case.hint, seed=job.seed)
        if got.fatal is not None:
            status = Status(got.fatal["status"]) if i == 0 else Status.NOT_RUN
            msg = got.fatal["error"] if i == 0 else "not run: your file could not be graded (see the first case)"
            out.append(CaseResult(status=status, message=msg, **base))
            continue
        if job.id in expected.broken:
            out.append(CaseResult(status=Status.ERROR, message=f"the reference failed this case, a bug in the exercise, not in your code:\n{expected.broken[job.id]}", **base))
            continue
        event = got.results.get(job.id)
        status, diff = decide(event, expected.obs.get(job.id))
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
    report = run_cases(ex.id, file, jobs, speed=True, **settings.kw())
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
    changes = snap.changes()
    if changes:
        snap.restore(changes)
        warnings.append("the graded code changed files the judge grades with: " + ", ".join(map(str, changes))
                        + ". The judge put them back as they were and graded with what it had read before the code ran.")
    return bool(changes)


def grade(
    exercise_id: str,
    path: Optional[str | Path] = None,
    *,
    seed: Optional[int] = None,
    save: bool = True,
    timeout_scale: float = 1.0,
    memory_limit_gb: Optional[float] = None,
) -> GradeResult:
    """Grade `path` (default: work/<id>.py) on exercise `exercise_id`; returns a GradeResult.

    The reference and the learner's piece each run in a subprocess, in parallel. Seeded cases get
    fresh seeds unless `seed` fixes them. `timeout_scale` and `memory_limit_gb` adjust the limits
    (for slow machines, or tests of the limits themselves)."""
    ex = registry.load(exercise_id)
    file = Path(path) if path is not None else registry.learner_path(exercise_id)
    if not file.is_file():
        raise FileNotFoundError(f"{file} does not exist: run `python judge.py start {exercise_id}` to get the starter there")
    file = file.resolve()
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
    fixed_keys = [j.key for j in jobs if j.seed is None]
    use_recorded = reference.usable(recorded, fp, fixed_keys)
    ref_jobs = [j for j in jobs if j.seed is not None or not use_recorded]
    if use_recorded:
        notes.append("fixed cases compared with the recorded reference outputs; seeded cases with the reference run now")
    elif recorded is None:
        notes.append("no recorded reference outputs: the reference ran on this machine")
    else:
        notes.append(f"reference outputs were recorded on {reference.describe(recorded['fingerprint'])}; this machine differs, so the reference was recomputed here")
    settings = Settings(memory_limit_gb or ex.memory_limit_gb, default_threads(2), use_cuda)
    reset_cancel()
    try:
        with ThreadPoolExecutor(2) as pool:
            try:
                ref_future = pool.submit(run_reference, ex, ref_jobs, settings) if ref_jobs else None
                got = pool.submit(run_file, ex, file, jobs, settings).result()
                ref = ref_future.result() if ref_future else WorkerReport()
            except KeyboardInterrupt:
                cancel_all()  # end the subprocesses, or the pool would wait for them
                raise
        if _put_back(snap, warnings) and ref_jobs:
            ref = run_reference(ex, ref_jobs, settings)  # it ran while the files were changed: run it again
        expected = expected_from(jobs, ref, recorded["cases"] if use_recorded else None)
        if expected.broken:  # the graded code may have killed the reference's worker: once more, alone
            sweep()
            again = [j for j in ref_jobs if j.id in expected.broken]
            rerun = run_reference(ex, again, settings)
            ref.results.update({k: v for k, v in rerun.results.items() if v.get("completed")})
            ref.fatal = ref.fatal if rerun.fatal else None
            expected = expected_from(jobs, ref, recorded["cases"] if use_recorded else None)
        if got.skipped:
            notes.append("optional helpers you did not write (the engine's are hidden too): " + ", ".join(got.skipped))
        result = GradeResult(exercise_id, _display(file), fp["device"], verdicts(ex, jobs, expected, got), notes, warnings=warnings)
        if result.ok:
            result.speed = timing(ex, file, settings, fp["device"])
            _put_back(snap, warnings)
    finally:
        _put_back(snap, warnings)
        sweep()
    if save:
        progress.record(result)
    return result


def _display(file: Path) -> str:
    try:
        return str(file.relative_to(registry.REPO_ROOT))
    except ValueError:
        return str(file)
