"""Where a learner's answer to an exercise is: a file `<id>.py`, or the `%%judge <id>` cell of a
notebook; and whether it is still the untouched starter.

    find(folder, "prefill-adder")     # a Submission: the source to grade, or why there is none
    untouched(source, exercise)       # True when every piece still raises NotImplementedError
"""

from __future__ import annotations

import ast
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Optional, Sequence

from .api import Replace

MAGIC = "%%judge"


@dataclass
class Submission:
    learner: str
    path: Optional[Path] = None  # the file the source came from (a .py, or the notebook)
    source: Optional[str] = None  # the code to grade; None when there is none
    reason: str = ""  # why there is no source: missing, unreadable, ...
    warnings: List[str] = field(default_factory=list)  # several candidates: which one was taken, and why

    @property
    def found(self) -> bool:
        return self.source is not None


def judge_cell(notebook: dict, exercise_id: str) -> Optional[str]:
    """The body of the last code cell that begins with `%%judge <exercise_id>`, or None."""
    body = None
    for cell in notebook.get("cells", []):
        if cell.get("cell_type") != "code":
            continue
        src = cell.get("source", "")
        src = "".join(src) if isinstance(src, list) else str(src)
        first, _, rest = src.lstrip().partition("\n")
        words = first.split()
        if len(words) >= 2 and words[0] == MAGIC and words[1] == exercise_id:
            body = rest
    return body


def read(learner: str, path: Path, exercise_id: str) -> Submission:
    """The source in `path` (a .py file, or a notebook's `%%judge <id>` cell)."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        return Submission(learner, path, reason=f"{path.name} is not UTF-8 text")
    except OSError as exc:
        return Submission(learner, path, reason=f"{path.name} cannot be read ({exc.strerror or exc})")
    if path.suffix != ".ipynb":
        return Submission(learner, path, text)
    try:
        cell = judge_cell(json.loads(text), exercise_id)
    except (ValueError, AttributeError, TypeError) as exc:
        return Submission(learner, path, reason=f"{path.name} is not a readable notebook ({type(exc).__name__}: {exc})")
    if cell is None:
        return Submission(learner, path, reason=f"{path.name} has no cell that begins with `{MAGIC} {exercise_id}`")
    return Submission(learner, path, cell)


def _candidates(folder: Path, exercise_id: str) -> List[Path]:
    """Every file in `folder` that may hold the answer, most likely first: `<id>.py` at the top,
    then in subfolders, then the notebooks (the last by name first, `Untitled*` last of all).
    Checkpoint copies are left out."""
    names = (f"{exercise_id}.py", f"{exercise_id.replace('-', '_')}.py")
    top = [folder / n for n in names if (folder / n).is_file()]
    nested = sorted(p for n in names for p in folder.rglob(n) if p.parent != folder)  # an upload that kept its folders
    notebooks = sorted(folder.rglob("*.ipynb"), reverse=True)
    notebooks.sort(key=lambda p: p.name.lower().startswith("untitled"))  # a scratch notebook after the chapters
    found = [p for p in top + nested + notebooks if ".ipynb_checkpoints" not in p.parts]
    return list(dict.fromkeys(found))  # `<id>.py` and `<id_>.py` may be one file on a case-folding disk


def find(folder: Path, exercise_id: str) -> Submission:
    """A learner's answer in `folder`: `<id>.py` (or `<id with underscores>.py`), else the
    notebook that holds a `%%judge <id>` cell (the last such cell of the last notebook by name).
    Where several files hold an answer, the first that is not the untouched starter is taken,
    and a warning names the others."""
    learner = folder.name
    if not folder.is_dir():
        return Submission(learner, reason=f"{folder} is not a folder")
    candidates = _candidates(folder, exercise_id)
    read_all = [read(learner, p, exercise_id) for p in candidates]
    answers = [sub for sub in read_all if sub.found]
    if answers:
        from .registry import declared

        replaces = declared(exercise_id).replaces
        started = [sub for sub in answers if not untouched(sub.source or "", replaces)]
        chosen = (started or answers)[0]
        if len(answers) > 1:
            others = ", ".join(str(a.path.relative_to(folder)) for a in answers if a is not chosen)
            why = " (the others are untouched starters)" if started and len(started) == 1 else ""
            chosen.warnings.append(f"{learner}: several files hold an answer; graded {chosen.path.relative_to(folder)}, "
                                   f"not {others}{why}")
        return chosen
    unreadable = [p for p in read_all if "has no cell" not in p.reason]
    if unreadable:
        return unreadable[0]
    notebooks = [p for p in candidates if p.suffix == ".ipynb"]
    where = f" (its notebooks: {', '.join(p.name for p in notebooks[:5])})" if notebooks else ""
    return Submission(learner, reason=f"no {exercise_id}.py and no notebook with a `{MAGIC} {exercise_id}` cell{where}")


def _is_stub(fn: ast.AST) -> bool:
    body = list(getattr(fn, "body", []))
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
        body = body[1:]  # the docstring
    if not body or not isinstance(body[0], ast.Raise) or body[0].exc is None:
        return False  # (whatever follows the raise never runs: a starter's `yield` that makes a generator)
    exc = body[0].exc
    name = exc.func if isinstance(exc, ast.Call) else exc
    return isinstance(name, ast.Name) and name.id == "NotImplementedError"


def untouched(source: str, replaces: Sequence[Replace]) -> bool:
    """True when every piece the exercise asks for is still the starter's stub (its body only
    raises NotImplementedError): the learner has not started, so there is nothing to grade."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return False
    required = [r for r in replaces if not r.optional]
    for r in required:
        body = tree.body
        if r.owner is not None:
            cls = next((n for n in body if isinstance(n, ast.ClassDef) and n.name == r.owner), None)
            if cls is None:
                return False
            body = cls.body
        fn = next((n for n in body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == r.attr), None)
        if fn is None or not _is_stub(fn):
            return False
    return bool(required)
