"""Find exercises (every `exercises/<id>/cases.py`) and load their declarations (exercise.toml)
and cases."""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import re
import sys
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Dict, Iterator, List, Optional

from . import declaration
from .api import Case, Exercise, take_pending

REPO_ROOT = Path(__file__).resolve().parent.parent
EXERCISES_DIR = REPO_ROOT / "exercises"
WORK_DIR = REPO_ROOT / "work"
# The judge's state: the learner's progress record (results.json) and the files `check` generates.
# The variable names another folder for it; the test suite sets it to a temporary one, so that its
# gradings (and the notebooks it runs, whose kernels inherit it) never touch a learner's record.
STATE_ENV = "JUDGE_STATE_DIR"
STATE_DIR = Path(os.environ.get(STATE_ENV) or REPO_ROOT / ".judge").resolve()
REFERENCE_DIR = Path(__file__).resolve().parent / "reference"


class UnknownExerciseError(KeyError):
    def __str__(self) -> str:
        return str(self.args[0])


def exercise_ids() -> List[str]:
    return sorted(p.parent.name for p in EXERCISES_DIR.glob("*/cases.py"))


def folder(exercise_id: str) -> Path:
    path = EXERCISES_DIR / exercise_id
    if not (path / "cases.py").is_file():
        known = ", ".join(exercise_ids()) or "(none)"
        raise UnknownExerciseError(f"no exercise {exercise_id!r}; known exercises: {known}")
    return path


_LOADED: Dict[str, Exercise] = {}
# cases register through one module-level list (`take_pending`), and importing the engine from two
# threads at once can deadlock on its circular imports: one exercise is loaded at a time
_LOADING = threading.RLock()


def _is_engine_module(name: str) -> bool:
    return name == "minisgl" or name.startswith("minisgl.")


@contextmanager
def full_engine() -> Iterator[None]:
    """Import from the repository's full `minisgl`, even in a notebook that staged an earlier
    chapter's copy of it; the notebook's own modules are put back afterwards untouched."""
    spec = importlib.util.find_spec("minisgl") if "minisgl" not in sys.modules else None
    current = sys.modules["minisgl"].__file__ if "minisgl" in sys.modules else (spec.origin if spec else None)
    if current is not None and Path(current).resolve() == (REPO_ROOT / "minisgl" / "__init__.py").resolve():
        yield  # already the full engine
        return
    saved = {k: v for k, v in sys.modules.items() if _is_engine_module(k)}
    saved_path = list(sys.path)
    for k in saved:
        del sys.modules[k]
    sys.path.insert(0, str(REPO_ROOT))
    try:
        yield
    finally:
        for k in [k for k in sys.modules if _is_engine_module(k)]:
            del sys.modules[k]
        sys.modules.update(saved)
        sys.path[:] = saved_path


def declared(exercise_id: str) -> Exercise:
    """The exercise as `exercises/<id>/exercise.toml` declares it, without its cases (no engine
    import: what listings need). Raises declaration.DeclarationError when that file is malformed."""
    if exercise_id in _LOADED:
        return _LOADED[exercise_id]
    return declaration.load(folder(exercise_id))


def _import_cases(path: Path, name: str) -> List[Case]:
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    take_pending()
    with full_engine():
        spec.loader.exec_module(module)
    if hasattr(module, "EXERCISE"):
        raise declaration.DeclarationError(f"{path} defines EXERCISE: an exercise is declared once, in {declaration.FILE_NAME}")
    cases = take_pending()
    if not cases:
        raise ValueError(f"{path}: no cases registered with @case")
    return cases


def hidden_cases_path(cases_dir: str | Path, exercise_id: str) -> Path:
    """Where an instructor's folder keeps an exercise's hidden cases: `<dir>/<id>/cases.py`."""
    path = Path(cases_dir).expanduser().resolve() / exercise_id / "cases.py"
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist: --cases-dir holds one folder per exercise, <dir>/{exercise_id}/cases.py")
    return path


def load(exercise_id: str, cases_dir: Optional[str | Path] = None) -> Exercise:
    """The declared exercise with the cases `exercises/<id>/cases.py` registers (imported once per
    process), and, with `cases_dir`, the instructor's hidden cases of `<cases_dir>/<id>/cases.py`
    after them (their keys start with "hidden:")."""
    with _LOADING:
        return _load(exercise_id, cases_dir)


def _load(exercise_id: str, cases_dir: Optional[str | Path]) -> Exercise:
    if cases_dir is not None:
        path = hidden_cases_path(cases_dir, exercise_id)
        key = f"{exercise_id}@{path}"
        if key not in _LOADED:
            public = load(exercise_id)
            name = "judge_hidden_cases_" + re.sub(r"\W", "_", exercise_id)
            hidden = [dataclasses.replace(c, hidden=True) for c in _import_cases(path, name)]
            _LOADED[key] = dataclasses.replace(public, cases=public.cases + hidden)
        return _LOADED[key]
    if exercise_id in _LOADED:
        return _LOADED[exercise_id]
    ex = declared(exercise_id)
    path = folder(exercise_id) / "cases.py"
    ex.cases = _import_cases(path, "judge_cases_" + re.sub(r"\W", "_", exercise_id))
    unknown = sorted(set(ex.weights) - {c.key for c in ex.cases})
    if unknown:
        raise declaration.DeclarationError(f"exercises/{exercise_id}/{declaration.FILE_NAME}: field 'weights' names {', '.join(unknown)}, "
                                           f"which are not case functions of its cases.py ({', '.join(c.key for c in ex.cases)})")
    _LOADED[exercise_id] = ex
    return ex


def learner_path(exercise_id: str) -> Path:
    return WORK_DIR / f"{exercise_id}.py"


def hints(exercise_id: str) -> List[str]:
    """The sections of hints.md, in order (hint 1 first)."""
    path = folder(exercise_id) / "hints.md"
    if not path.exists():
        return []
    parts = re.split(r"^## Hint \d+.*$", path.read_text(), flags=re.M)
    return [p.strip() for p in parts[1:]]
