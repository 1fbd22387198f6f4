"""The maintainers' check: for every exercise the reference passes, the solution passes, the
starter and every deliberately wrong variant fail, and the recorded reference outputs are current."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional

from . import confinement, reference, registry, variants
from .compare import first_difference
from .grade import Settings, current_fingerprint, cuda_available, default_threads, expected_from, plan, run_file, run_reference, verdicts
from .result import Status
from .runner import reset_cancel

CHECK_SEED = 20261130  # check draws the same seeds every time, so a failure can be replayed


@dataclass
class ExerciseCheck:
    exercise: str
    problems: List[str] = field(default_factory=list)
    lines: List[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.problems


def candidates(exercise_id: str) -> Dict[str, Path]:
    """What check grades, by the name it reports: the answer and the wrong variants derived by
    `variants` (raises VariantError when one cannot be built), and the starter."""
    files = variants.materialise(registry.load(exercise_id))
    answer = files.pop("solution.py")
    wrong = {f"variant {k[len('wrong/'):-len('.py')]}": v for k, v in files.items()}
    return {"solution": answer, "starter.py": registry.folder(exercise_id) / "starter.py", **wrong}


def check_one(exercise_id: str, parallel: int = 1, record: bool = False) -> ExerciseCheck:
    t0 = time.perf_counter()
    ex = registry.load(exercise_id)
    out = ExerciseCheck(exercise_id)
    d = registry.folder(exercise_id)
    for needed in ("README.md", "hints.md", "starter.py"):
        if not (d / needed).is_file():
            out.problems.append(f"missing {needed}")
    try:
        cands = candidates(exercise_id)
    except variants.VariantError as exc:
        out.problems.append(str(exc))
        cands = {}
    if cands and len(cands) == 2:
        out.problems.append("no deliberately wrong variants in wrong.toml")
    hint_count = len(registry.hints(exercise_id))
    for c in ex.cases:
        if c.hint is not None and not 1 <= c.hint <= hint_count:
            out.problems.append(f"case {c.key} points at hint {c.hint}, hints.md has {hint_count}")
    jobs = plan(ex, CHECK_SEED)
    settings = Settings(ex.memory_limit_gb, default_threads(parallel), cuda_available())
    ref = run_reference(ex, jobs, settings)
    expected = expected_from(jobs, ref)
    if ref.fatal or expected.broken:
        why = ref.fatal["error"] if ref.fatal else "; ".join(f"{b}: {e}" for b, e in expected.broken.items())
        out.problems.append(f"the reference engine fails its own cases: {why}")
        out.seconds = time.perf_counter() - t0
        return out
    fp = ref.fingerprint
    fixed = {j.key: expected.obs[j.id] for j in jobs if j.seed is None}
    recorded = reference.load(exercise_id)
    if record:
        reference.save(exercise_id, fp, fixed)
        out.lines.append(f"recorded {len(fixed)} fixed cases on {reference.describe(fp)}")
    elif recorded is None:
        out.problems.append(f"no recorded reference: run `python judge.py record {exercise_id}`")
    elif reference.differences(recorded["fingerprint"], fp):
        out.lines.append(f"recording not compared: {'; '.join(reference.differences(recorded['fingerprint'], fp))}")
    else:
        for key, obs in fixed.items():
            if key not in recorded["cases"]:
                out.problems.append(f"case {key} has no recorded reference: run `python judge.py record {exercise_id}`")
                continue
            diff = first_difference(obs, recorded["cases"][key])
            if diff is not None:
                out.problems.append(f"recorded reference for {key} is stale at '{diff.where}' ({diff.detail or diff.got}): run `python judge.py record {exercise_id}`")

    for rel, cand in cands.items():
        must_pass = rel == "solution"
        # a variant only has to fail once: stop at its first non-passing case
        got = run_file(ex, cand, jobs, settings, stop_at_first_failure=None if must_pass else expected)
        results = [r for r in verdicts(ex, jobs, expected, got) if r.status is not Status.NOT_RUN or got.fatal is not None]
        bad = [r for r in results if not r.passed]
        if must_pass and bad:
            first = bad[0]
            out.problems.append(f"{rel} should pass but {first.name}: {first.status} {first.where} {first.got} vs {first.expected} {first.message}".strip())
        elif not must_pass and not bad:
            out.problems.append(f"{rel} should fail but passes every case")
        else:
            first = bad[0] if bad else None
            what = f"fails '{first.name}' ({first.status})" if first else f"passes {len(results)} cases"
            out.lines.append(f"{rel}: {what}")
    out.seconds = time.perf_counter() - t0
    return out


def check(exercise_ids: Optional[List[str]] = None, jobs: int = 2, record: bool = False, echo=print) -> bool:
    ids = exercise_ids or registry.exercise_ids()
    reset_cancel()  # an interrupted grading earlier in this process must not stop these runs
    t0 = time.perf_counter()
    echo(f"checking {len(ids)} exercises on {current_fingerprint()['device']} with {jobs} parallel jobs")
    gaps = confinement.missing()  # the wrong variants run as graded code: say how confined
    echo("sandbox: " + (f"MISSING {', '.join(p.name for p in gaps)} (see `python judge.py sandbox`)" if gaps
                        else ", ".join(f"{p.name} ({p.by})" for p in confinement.survey())))
    all_ok = True
    for i in ids:  # imported one by one before the checks run side by side: no import races the engine's
        registry.load(i)
    with ThreadPoolExecutor(max(1, jobs)) as pool:
        for res in pool.map(lambda i: check_one(i, jobs, record), ids):
            all_ok &= res.ok
            echo(f"{'ok  ' if res.ok else 'FAIL'} {res.exercise} ({res.seconds:.0f} s)")
            for line in res.lines:
                echo(f"     {line}")
            for p in res.problems:
                echo(f"  !! {p}")
    echo(f"{'all exercises check out' if all_ok else 'some exercises are broken'} ({time.perf_counter() - t0:.0f} s)")
    return all_ok
