"""`python judge.py ...`: list, start, hint, answer, grade, grade-all, check, record, sandbox."""

from __future__ import annotations

import argparse
import shutil
import sys
from typing import List, Optional

from . import confinement, registry
from .declaration import DeclarationError
from .ledger import LedgerError

_STARS = {1: "*", 2: "**", 3: "***"}


def _rel(path) -> str:
    try:
        return str(path.relative_to(registry.REPO_ROOT))
    except ValueError:
        return str(path)


def cmd_list(_: argparse.Namespace) -> int:
    from . import progress

    record = progress.load()
    rows = []
    for ex in sorted((registry.declared(i) for i in registry.exercise_ids()), key=lambda e: (e.chapter, e.id)):
        p = record.get(ex.id)
        if p is not None:
            best, latest = str(p.best), str(p.latest)
        else:
            best, latest = ("started" if registry.learner_path(ex.id).exists() else "-"), ""
        rows.append((ex, best, latest))
    width = max([len("latest")] + [max(len(b), len(l)) for _, b, l in rows]) + 1
    print(f"{'exercise':<18} {'ch':>3} {'diff':<5} {'best':<{width}} {'latest':<{width}} title")
    for ex, best, latest in rows:
        print(f"{ex.id:<18} {ex.chapter:>3} {_STARS[ex.difficulty]:<5} {best:<{width}} {latest:<{width}} {ex.title}")
    print("best: the most cases you have passed so far; latest: your last grading (both from .judge/results.json;"
          " an untouched starter is not graded, so it replaces neither)")
    return 0


def cmd_start(args: argparse.Namespace) -> int:
    src = registry.folder(args.exercise) / "starter.py"
    dst = registry.learner_path(args.exercise)
    if dst.exists():
        print(f"{_rel(dst)} already exists: keeping your work. Grade it with `python judge.py {args.exercise}`"
              f" (delete the file first to start over).")
        return 0
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, dst)
    print(f"wrote {_rel(dst)}: the statement is exercises/{args.exercise}/README.md;"
          f" grade with `python judge.py {args.exercise}`")
    return 0


def cmd_hint(args: argparse.Namespace) -> int:
    hints = registry.hints(args.exercise)
    if not hints:
        print("this exercise has no hints")
        return 0
    n = min(max(args.n, 1), len(hints))
    for i in range(n):
        print(f"--- hint {i + 1} of {len(hints)} ---\n{hints[i]}\n")
    return 0


def cmd_answer(args: argparse.Namespace) -> int:
    from . import variants

    print(f"# A complete answer to {args.exercise}: the engine's own code for each piece, in the starter's shape.")
    print(variants.base_source(registry.load(args.exercise)), end="")
    return 0


def _write_outputs(args: argparse.Namespace, result, reason: str = "", name: str = "") -> None:
    """--gradescope and --junit of `grade`: the result, or (no result) why nothing was graded."""
    import json
    from pathlib import Path

    from . import formats
    from .files import write_whole

    if args.gradescope:
        ex = registry.load(args.exercise, args.cases_dir)
        max_points = sum(ex.weight_of(c) for c in ex.cases)
        data = formats.gradescope(result, reason=reason, max_points=max_points, hidden_visibility=args.hidden_visibility)
        Path(args.gradescope).parent.mkdir(parents=True, exist_ok=True)
        write_whole(args.gradescope, json.dumps(data, indent=1) + "\n")  # a new file renamed into place: a planted link is replaced, not followed
    if args.junit:
        Path(args.junit).parent.mkdir(parents=True, exist_ok=True)
        write_whole(args.junit, formats.junit({name or args.exercise: result if result is not None else reason}, name=f"judge: {args.exercise}"))


def _protected(args: argparse.Namespace) -> List[str]:
    """Folders the graded code may not open: those named with --protect, and where the outputs go."""
    import os

    outputs = [os.path.dirname(os.path.abspath(p)) for p in (args.gradescope, args.junit) if p]
    return list(args.protect or []) + outputs


def _not_started(args: argparse.Namespace, source: str, where: str) -> bool:
    """A learner's untouched starter is not graded and not recorded, as in a `%%judge` cell; an
    instructor's --gradescope / --junit run grades it (every case fails)."""
    from . import submission
    from .magic import NotStarted

    if args.gradescope or args.junit or not submission.untouched(source, registry.declared(args.exercise).replaces):
        return False
    again = f"run `python judge.py {args.exercise}{' --file ' + args.file if args.file else ''}` again"
    print(NotStarted(args.exercise, where, again))
    return True


def cmd_grade(args: argparse.Namespace) -> int:
    from pathlib import Path

    from . import scratch, submission
    from .files import create_new
    from .grade import grade

    from . import progress

    registry.folder(args.exercise)
    weaker = confinement.require(args.allow_weaker_sandbox) if args.gradescope else []  # an autograder grades a class
    file = Path(args.file) if args.file else None
    protect = _protected(args)
    if file is None or not (file.is_dir() or file.suffix == ".ipynb"):
        path = (file or registry.learner_path(args.exercise)).resolve()
        if _not_started(args, path.read_text() if path.is_file() else "", _rel(path)):
            return 1
        result = grade(args.exercise, file, seed=args.seed, cases_dir=args.cases_dir, save=not args.no_record, protect=protect)
    else:  # a submission folder (an autograder's) or a notebook: the answer is found as grade-all finds it
        sub = submission.find(file, args.exercise) if file.is_dir() else submission.read(file.stem, file, args.exercise)
        for warning in sub.warnings:
            print(f"warning: {warning}", file=sys.stderr)
        if not sub.found:
            print(f"error: nothing to grade: {sub.reason}", file=sys.stderr)
            _write_outputs(args, None, reason=sub.reason, name=str(file))
            return 2
        where = _rel(sub.path.resolve()) if sub.path else str(file)
        if _not_started(args, sub.source, f"the %%judge cell of {where}" if where.endswith(".ipynb") else where):
            return 1
        tmp = scratch.private_dir("grade")  # the judge's own folder: the graded code reads its copy, nothing beside it
        copy = tmp / f"{args.exercise.replace('-', '_')}.py"
        create_new(copy, sub.source)
        try:
            result = grade(args.exercise, copy, seed=args.seed, cases_dir=args.cases_dir, save=False, protect=protect)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        result.file = str(sub.path)
        result.warnings.extend(sub.warnings)  # which of several files was graded: the learner sees it too
        for case in result.cases:
            case.message = case.message.replace(str(copy.resolve()), result.file).replace(str(copy), result.file)
        if not args.no_record:
            progress.record(result)
    result.warnings.extend(weaker)
    print(result)
    _write_outputs(args, result, name=result.file)
    return 0 if result.ok else 1


def cmd_grade_all(args: argparse.Namespace) -> int:
    from pathlib import Path

    from .batch import grade_all
    from .gradebook import read_roster

    out = Path(args.out or f"grades-{args.exercise}")
    only = [n.strip() for n in args.only.split(",") if n.strip()] if args.only else None
    roster = read_roster(args.roster) if args.roster else None
    batch = grade_all(args.submissions, args.exercise, out=out, jobs=args.jobs, seed=args.seed, cases_dir=args.cases_dir,
                      timeout_scale=args.timeout_scale, resume=args.resume, only=only, roster=roster,
                      allow_weaker_sandbox=args.allow_weaker_sandbox)
    paths = batch.write(out, hidden_visibility=args.hidden_visibility)
    graded = [g for g in batch.learners if g.result is not None]
    print(f"{len(graded)} of {len(batch.learners)} learners graded in {batch.seconds:.0f} s (seed {batch.seed}); "
          f"{sum(g.result.ok for g in graded)} pass every case")
    for g in batch.learners:
        r = g.result
        print(f"  {g.learner:<24} " + (f"{r.points:g}/{r.max_points:g} points, {r.passed}/{r.total} cases" if r else f"{g.verdict}: {g.reason}"))
    print(f"wrote {paths['csv']}, {paths['totals']}, {paths['json']}, {paths['junit']} and {out / 'gradescope'}/<learner>/results.json")
    return 130 if batch.interrupted else 0


def cmd_sandbox(_: argparse.Namespace) -> int:
    print(confinement.describe())
    gaps = confinement.missing()
    if gaps:
        print(f"grade-all and `grade --gradescope` refuse to grade here without {confinement.FLAG}")
    return 1 if gaps else 0


def cmd_check(args: argparse.Namespace) -> int:
    from .check import check

    return 0 if check(args.exercises or None, jobs=args.jobs, record=args.record) else 1


def _default_jobs() -> int:
    import os

    return max(2, min(8, (os.cpu_count() or 2) // 2))


def _course_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--cases-dir", default=None, help="instructors: a folder outside the repository with hidden cases, <dir>/<id>/cases.py")
    p.add_argument("--hidden-visibility", default="after_published", choices=("hidden", "after_due_date", "after_published", "visible"),
                   help="on Gradescope, when learners see the hidden cases (default: after_published)")
    p.add_argument(confinement.FLAG, action="store_true",
                   help="grade a class (grade-all, --gradescope) even where this machine lacks part of the sandbox (see `judge.py sandbox`)")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="judge.py", description="Grade the workbook's exercises against the reference engine.")
    sub = p.add_subparsers(dest="command")
    sub.add_parser("list", help="every exercise with its chapter, difficulty, your best and your latest result").set_defaults(fn=cmd_list)
    s = sub.add_parser("start", help="copy an exercise's starter to work/<id>.py (never overwrites your work)")
    s.add_argument("exercise", help="exercise id, e.g. prefill-adder")
    s.set_defaults(fn=cmd_start)
    h = sub.add_parser("hint", help="show the first N hints of an exercise")
    h.add_argument("exercise", help="exercise id")
    h.add_argument("n", type=int, nargs="?", default=1, help="how many hints to show (default 1)")
    h.set_defaults(fn=cmd_hint)
    a = sub.add_parser("answer", help="print a complete answer (the engine's own code in the starter's shape): read it after trying")
    a.add_argument("exercise", help="exercise id")
    a.set_defaults(fn=cmd_answer)
    g = sub.add_parser("grade", help="grade an exercise (same as `judge.py <id>`)")
    g.add_argument("exercise", help="exercise id")
    g.add_argument("--file", default=None, help="grade this file instead of work/<id>.py (a .py, a notebook's %%%%judge cell, or a submission folder)")
    g.add_argument("--seed", type=int, default=None, help="fix the seeds of the randomised cases (to replay a run)")
    _course_options(g)
    g.add_argument("--gradescope", metavar="PATH", default=None, help="also write Gradescope's autograder results.json here")
    g.add_argument("--junit", metavar="PATH", default=None, help="also write the grading as JUnit XML here")
    g.add_argument("--no-record", action="store_true", help="leave .judge/results.json (your progress) as it is")
    g.add_argument("--protect", action="append", metavar="DIR", default=None,
                   help="a folder the graded code may not open (repeatable); the folders of --gradescope and --junit always are")
    g.set_defaults(fn=cmd_grade)
    ga = sub.add_parser("grade-all", help="instructors: grade one folder per learner; writes a table (CSV, JSON), JUnit XML and Gradescope results")
    ga.add_argument("submissions", help="a folder with one folder per learner, each holding <id>.py or a notebook with a %%%%judge <id> cell")
    ga.add_argument("--exercise", required=True, help="exercise id")
    ga.add_argument("--jobs", type=int, default=_default_jobs(), help="learners graded at the same time")
    ga.add_argument("--seed", type=int, default=None, help="the seeds of the randomised cases, the same for every learner (default: drawn once, reported)")
    ga.add_argument("--out", default=None, help="where the tables go (default: grades-<id>/)")
    ga.add_argument("--timeout-scale", type=float, default=1.0, help="multiply every case's time limit (a slow machine)")
    ga.add_argument("--resume", action="store_true", help="grade only the learners not yet recorded in --out (after an interrupted run)")
    ga.add_argument("--only", default=None, metavar="NAMES", help="regrade these learners (comma-separated) and merge them with those recorded in --out")
    ga.add_argument("--roster", default=None, metavar="FILE", help="learner names, one a line: those with no folder appear as missing")
    _course_options(ga)
    ga.set_defaults(fn=cmd_grade_all)
    for name, helptext, record in (("check", "maintainers: reference passes, starters and wrong variants fail", False),
                                   ("record", "maintainers: record the reference outputs of the fixed cases, then check", True)):
        c = sub.add_parser(name, help=helptext)
        c.add_argument("exercises", nargs="*", help="exercise ids (default: all)")
        c.add_argument("--jobs", type=int, default=_default_jobs(), help="exercises checked in parallel")
        c.set_defaults(fn=cmd_check, record=record)
    sub.add_parser("sandbox", help="what the graded code is kept from doing on this machine, and what the judge needs for it").set_defaults(fn=cmd_sandbox)
    return p


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    commands = {"list", "start", "hint", "answer", "grade", "grade-all", "check", "record", "sandbox", "-h", "--help"}
    if argv and argv[0] not in commands:
        argv = ["grade", *argv]  # `judge.py <id> [--file PATH]`
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "fn", None):
        parser.print_help()
        return 0
    try:
        return args.fn(args)
    except (registry.UnknownExerciseError, FileNotFoundError, DeclarationError, LedgerError, confinement.WeakSandboxError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `judge.py list | head`: the reader has all it wanted
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
        return 0
