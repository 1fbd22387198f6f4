"""Grade one file against one exercise: plan the cases, run the reference and the learner's piece
side by side in subprocesses, and turn the two sets of observations into verdicts."""

from __future__ import annotations

import os
import random
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from . import progress, reference, registry
from .api import Exercise
from .compare import first_difference
from .result import CaseResult, GradeResult
from .runner import CaseJob, WorkerReport, cancel_all, reset_cancel, run_cases


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


def verdicts(ex: Exercise, jobs: List[CaseJob], expected: Dict[str, List[Dict[str, Any]]], ref: WorkerReport, got: WorkerReport) -> List[CaseResult]:
    by_key = {c.key: c for c in ex.cases}
    out: List[CaseResult] = []
    for i, job in enumerate(jobs):
        case = by_key[job.key]
        name = case.name + (f" (seed {job.seed})" if job.seed is not None else "")
        base = dict(name=name, kind=case.kind, hint=case.hint, seed=job.seed)
        if got.fatal is not None:
            msg = got.fatal["error"] if i == 0 else "not run: your file could not be graded (see the first case)"
            out.append(CaseResult(status=got.fatal["status"], message=msg, **base))
            continue
        mine = got.results.get(job.id)
        ref_result = ref.results.get(job.id)
        if job.id not in expected:
            why = ref.fatal["error"] if ref.fatal else (ref_result or {}).get("error", "no reference output")
            out.append(CaseResult(status="error", message=f"the reference failed this case, a bug in the exercise, not in your code:\n{why}", **base))
            continue
        if mine is None:
            out.append(CaseResult(status="error", message="not run (grading stopped early)", **base))
            continue
        seconds = mine.get("seconds", 0.0)
        if mine["status"] != "ok":
            partial = mine.get("obs", [])
            diff = first_difference(partial, expected[job.id][: len(partial)]) if partial else None
            extra: Dict[str, str] = {}
            if diff is not None:  # it went wrong before it crashed: show the first difference too
                extra = dict(where=diff.where, got=diff.got, expected=diff.expected)
            elif partial:
                extra = dict(where=f"after '{partial[-1]['label']}' (everything recorded up to there matched)")
            out.append(CaseResult(status=mine["status"], message=mine.get("error", "") + _printed(mine), seconds=seconds, **base, **extra))
            continue
        diff = first_difference(mine["obs"], expected[job.id])
        if diff is None:
            out.append(CaseResult(status="pass", seconds=seconds, **base))
        else:
            out.append(CaseResult(status="fail", where=diff.where, got=diff.got, expected=diff.expected,
                                  message=diff.detail + _printed(mine), seconds=seconds, **base))
    return out


def _printed(event: Dict[str, Any]) -> str:
    text = (event.get("printed") or "").rstrip()
    return f"\nyour code printed:\n{text}" if text else ""


def _expected(ref: WorkerReport, recorded: Optional[Dict[str, Any]], use_recorded: bool, jobs: List[CaseJob]) -> Dict[str, List[Dict[str, Any]]]:
    exp: Dict[str, List[Dict[str, Any]]] = {}
    for job in jobs:
        if job.seed is None and use_recorded:
            exp[job.id] = recorded["cases"][job.key]
        else:
            r = ref.results.get(job.id)
            if r is not None and r["status"] == "ok":
                exp[job.id] = r["obs"]
    return exp


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
    jobs = plan(ex, seed)
    for j in jobs:
        j.timeout_s *= timeout_scale
    use_cuda = cuda_available()
    fp = current_fingerprint()
    recorded = reference.load(exercise_id)
    fixed_keys = [j.key for j in jobs if j.seed is None]
    use_recorded = reference.usable(recorded, fp, fixed_keys)
    ref_jobs = [j for j in jobs if j.seed is not None or not use_recorded]
    notes = [f"graded on {fp['device']}" + ("" if use_cuda else " (no GPU found: everything runs on the CPU)")]
    if use_recorded:
        notes.append("fixed cases compared with the recorded reference outputs; seeded cases with the reference run now")
    elif recorded is None:
        notes.append("no recorded reference outputs: the reference ran on this machine")
    else:
        notes.append(f"reference outputs were recorded on {reference.describe(recorded['fingerprint'])}; this machine differs, so the reference was recomputed here")
    kw = dict(memory_limit_gb=memory_limit_gb or ex.memory_limit_gb, threads=default_threads(2), use_cuda=use_cuda)
    reset_cancel()
    with ThreadPoolExecutor(2) as pool:
        try:
            ref_future = pool.submit(run_cases, exercise_id, None, ref_jobs, **kw) if ref_jobs else None
            got = pool.submit(run_cases, exercise_id, file, jobs, **kw).result()
            ref = ref_future.result() if ref_future else WorkerReport()
        except KeyboardInterrupt:
            cancel_all()  # end the subprocesses, or the pool would wait for them
            raise
    if got.skipped:
        notes.append("optional helpers you did not write (the engine's are hidden too): " + ", ".join(got.skipped))
    expected = _expected(ref, recorded, use_recorded, jobs)
    result = GradeResult(exercise_id, _display(file), fp["device"], verdicts(ex, jobs, expected, ref, got), notes)
    if save:
        progress.record(result)
    return result


def _display(file: Path) -> str:
    try:
        return str(file.relative_to(registry.REPO_ROOT))
    except ValueError:
        return str(file)


def run_reference(exercise_id: str, jobs: List[CaseJob], parallel: int = 1) -> WorkerReport:
    ex = registry.load(exercise_id)
    return run_cases(exercise_id, None, jobs, memory_limit_gb=ex.memory_limit_gb, threads=default_threads(parallel), use_cuda=cuda_available())


def compare_reports(ex: Exercise, jobs: List[CaseJob], expected: Dict[str, List[Dict[str, Any]]], ref: WorkerReport, got: WorkerReport) -> List[CaseResult]:
    return verdicts(ex, jobs, expected, ref, got)


def expected_from(ref: WorkerReport, jobs: List[CaseJob]) -> Tuple[Dict[str, List[Dict[str, Any]]], List[str]]:
    """The reference's observations per case id, and the ids where the reference itself failed."""
    exp, broken = {}, []
    for j in jobs:
        r = ref.results.get(j.id)
        if r is not None and r["status"] == "ok":
            exp[j.id] = r["obs"]
        else:
            broken.append(j.id)
    return exp, broken
