"""`python judge.py ...`: list, start, hint, answer, grade, check, record."""

from __future__ import annotations

import argparse
import shutil
import sys
from typing import List, Optional

from . import registry
from .declaration import DeclarationError

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
    print("best: your highest score so far; latest: your last grading (both from .judge/results.json)")
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


def cmd_grade(args: argparse.Namespace) -> int:
    from .grade import grade

    result = grade(args.exercise, args.file, seed=args.seed)
    print(result)
    return 0 if result.ok else 1


def cmd_check(args: argparse.Namespace) -> int:
    from .check import check

    return 0 if check(args.exercises or None, jobs=args.jobs, record=args.record) else 1


def _default_jobs() -> int:
    import os

    return max(2, min(8, (os.cpu_count() or 2) // 2))


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
    g.add_argument("--file", default=None, help="grade this file instead of work/<id>.py")
    g.add_argument("--seed", type=int, default=None, help="fix the seeds of the randomised cases (to replay a run)")
    g.set_defaults(fn=cmd_grade)
    for name, helptext, record in (("check", "maintainers: reference passes, starters and wrong variants fail", False),
                                   ("record", "maintainers: record the reference outputs of the fixed cases, then check", True)):
        c = sub.add_parser(name, help=helptext)
        c.add_argument("exercises", nargs="*", help="exercise ids (default: all)")
        c.add_argument("--jobs", type=int, default=_default_jobs(), help="exercises checked in parallel")
        c.set_defaults(fn=cmd_check, record=record)
    return p


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    commands = {"list", "start", "hint", "answer", "grade", "check", "record", "-h", "--help"}
    if argv and argv[0] not in commands:
        argv = ["grade", *argv]  # `judge.py <id> [--file PATH]`
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "fn", None):
        parser.print_help()
        return 0
    try:
        return args.fn(args)
    except (registry.UnknownExerciseError, FileNotFoundError, DeclarationError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `judge.py list | head`: the reader has all it wanted
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
        return 0
