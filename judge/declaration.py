"""An exercise's declaration: `exercises/<id>/exercise.toml`, the facts about it (chapter, title,
difficulty, the engine symbols the learner writes), read into an `Exercise` without its cases.

    chapter = 7
    title = "Admission control: PrefillAdder.try_admit"
    difficulty = 2
    replaces = ["minisgl.scheduler.prefill:PrefillAdder.try_admit"]
    optional = []                 # helpers the learner may write or leave out ("module:qualname")
    timed = ["PrefillAdder.try_admit"]
    timing_cases = []             # case function names; default: the fixed unit cases
    weights = { random_queues = 2 }   # points per case function name (default 1)

The id is the folder's name. `unit_timeout_s`, `e2e_timeout_s` and `memory_limit_gb` may override
the defaults of `Exercise`. Any other key, a missing one or a value of the wrong type raises
DeclarationError naming the file and the field.
"""

from __future__ import annotations

import sys
from dataclasses import fields
from pathlib import Path
from typing import Any, Dict, List, Tuple

from .api import Exercise, Replace

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: the same parser, as a package
    import tomli as tomllib

FILE_NAME = "exercise.toml"
_REQUIRED = {"chapter": int, "title": str, "difficulty": int, "replaces": list}
_KIND_NAMES = {int: "a whole number", float: "a number", str: "a string", list: "a list", dict: "a table"}
_OPTIONAL = {"optional": list, "timed": list, "timing_cases": list, "unit_timeout_s": float, "e2e_timeout_s": float, "memory_limit_gb": float,
             "weights": dict}


class DeclarationError(ValueError):
    """An exercise.toml that is missing, unreadable or malformed; the message names file and field."""


def read_toml(path: Path, error: type = DeclarationError) -> Dict[str, Any]:
    """The TOML file as a dict; a syntax error becomes `error` naming the file."""
    try:
        return tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise error(f"{_where(path)}: {exc}") from exc


def _where(path: Path) -> str:
    from .registry import REPO_ROOT

    try:
        return str(path.relative_to(REPO_ROOT))
    except ValueError:
        return str(path)


def _typed(where: str, data: Dict[str, Any], key: str, kind: type) -> Any:
    value = data[key]
    ok = isinstance(value, kind) and not (kind is int and isinstance(value, bool))
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value, ok = float(value), True
    if not ok:
        raise DeclarationError(f"{where}: field {key!r} must be {_KIND_NAMES[kind]}, got {value!r}")
    return value


def _strings(where: str, key: str, values: List[Any]) -> Tuple[str, ...]:
    bad = [v for v in values if not isinstance(v, str) or not v]
    if bad:
        raise DeclarationError(f"{where}: field {key!r} lists strings, got {bad[0]!r}")
    return tuple(values)


def _symbol(where: str, key: str, text: str, optional: bool) -> Replace:
    module, sep, qualname = text.partition(":")
    if not sep or not module or not qualname:
        raise DeclarationError(f"{where}: field {key!r}: {text!r} is not \"module:qualname\" (e.g. \"minisgl.core:Req.extend_len\")")
    try:
        return Replace(module, qualname, optional=optional)
    except ValueError as exc:
        raise DeclarationError(f"{where}: field {key!r}: {exc}") from exc


def parse(exercise_id: str, data: Dict[str, Any], path: Path) -> Exercise:
    """The Exercise (no cases yet) that `data`, read from `path`, declares."""
    where = _where(path)
    unknown = sorted(set(data) - set(_REQUIRED) - set(_OPTIONAL))
    if unknown:
        raise DeclarationError(f"{where}: unknown field(s) {', '.join(map(repr, unknown))}; the fields are {', '.join([*_REQUIRED, *_OPTIONAL])}")
    missing = [k for k in _REQUIRED if k not in data]
    if missing:
        raise DeclarationError(f"{where}: missing field(s) {', '.join(map(repr, missing))}")
    values = {k: _typed(where, data, k, kind) for k, kind in {**_REQUIRED, **_OPTIONAL}.items() if k in data}
    replaces = tuple(_symbol(where, "replaces", s, False) for s in _strings(where, "replaces", values.pop("replaces")))
    replaces += tuple(_symbol(where, "optional", s, True) for s in _strings(where, "optional", values.pop("optional", [])))
    names = [r.qualname for r in replaces]
    twice = sorted({q for q in names if names.count(q) > 1})
    if twice:
        raise DeclarationError(f"{where}: fields 'replaces'/'optional' name {', '.join(twice)} more than once")
    for key in ("timed", "timing_cases"):
        if key in values:
            values[key] = _strings(where, key, values[key])
    if "weights" in values:
        bad = [(k, v) for k, v in values["weights"].items() if isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0]
        if bad:
            raise DeclarationError(f"{where}: field 'weights': {bad[0][0]} = {bad[0][1]!r}; a weight is a positive number of points")
        values["weights"] = {k: float(v) for k, v in values["weights"].items()}
    assert set(values) <= {f.name for f in fields(Exercise)}
    try:
        return Exercise(id=exercise_id, replaces=replaces, **values)
    except ValueError as exc:  # Exercise's own checks (difficulty, timed symbols)
        raise DeclarationError(f"{where}: {exc}") from exc


def load(folder: Path) -> Exercise:
    """Read `folder/exercise.toml`; the exercise's id is the folder's name."""
    path = folder / FILE_NAME
    if not path.is_file():
        raise DeclarationError(f"{_where(path)} is missing: every exercise declares its chapter, title, difficulty and replaced symbols there")
    return parse(folder.name, read_toml(path), path)
