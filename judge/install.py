"""Put a learner's piece into the real engine, and keep the engine's own version out of reach.

Three steps, in the grading subprocess only:
1. `scan` reads the learner's source: reaching the very symbol being replaced (through
   `super()`, the engine class, or an import) is reported before anything runs.
2. `hide` swaps each replaced engine symbol for a trap that raises `ReferenceUsedError`, so the
   learner's module cannot grab the reference while it is imported.
3. `transplant` sets the learner's definitions onto the engine classes and modules, so the
   engine's own code calls them from then on.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Sequence

from .api import Replace


class ReferenceUsedError(RuntimeError):
    """The learner's code called the engine's own version of the piece it is writing."""


class MissingPieceError(AttributeError):
    """The learner's file does not define a symbol the exercise asks for."""


@dataclass(frozen=True)
class Finding:
    line: int
    message: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.message}"


def _resolve_owner(rep: Replace) -> Any:
    module = importlib.import_module(rep.module)
    return getattr(module, rep.owner) if rep.owner else module


def _trap(rep: Replace, original: Any) -> Any:
    def trap(*args: Any, **kwargs: Any) -> Any:
        raise ReferenceUsedError(
            f"your code called the engine's own {rep.qualname}, which is the piece this exercise asks "
            f"you to write; write it yourself (and don't call it through super() or the engine class)"
        )

    if isinstance(original, property):
        return property(trap)
    if isinstance(original, staticmethod):
        return staticmethod(trap)
    if isinstance(original, classmethod):
        return classmethod(trap)
    return trap


def hide(replaces: Sequence[Replace]) -> Dict[Replace, Any]:
    """Replace every engine symbol by a trap; returns the originals."""
    originals: Dict[Replace, Any] = {}
    for rep in replaces:
        owner = _resolve_owner(rep)
        original = vars(owner)[rep.attr] if rep.owner else getattr(owner, rep.attr)
        originals[rep] = original
        setattr(owner, rep.attr, _trap(rep, original))
    return originals


def load_learner(path: Path, module_name: str = "learner_solution") -> Any:
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    return module


def transplant(replaces: Sequence[Replace], learner: Any) -> List[str]:
    """Install the learner's definitions; returns the optional symbols left to the trap."""
    skipped: List[str] = []
    for rep in replaces:
        if rep.owner:
            cls = getattr(learner, rep.owner, None)
            if not isinstance(cls, type):
                if rep.optional:
                    skipped.append(rep.qualname)
                    continue
                raise MissingPieceError(f"your file does not define class {rep.owner} (with {rep.qualname})")
            if rep.attr not in vars(cls):
                if rep.optional:
                    skipped.append(rep.qualname)
                    continue
                raise MissingPieceError(f"your class {rep.owner} does not define {rep.attr}; the exercise asks for {rep.qualname}")
            value = vars(cls)[rep.attr]
        else:
            if not hasattr(learner, rep.attr):
                if rep.optional:
                    skipped.append(rep.qualname)
                    continue
                raise MissingPieceError(f"your file does not define {rep.qualname}")
            value = getattr(learner, rep.attr)
        setattr(_resolve_owner(rep), rep.attr, value)
    return skipped


def exercise_files_loaded(module_names, learner_file: str) -> List[str]:
    """Files under exercises/ (a reference solution, a wrong variant) that loading the learner's
    file pulled in, other than the learner's file itself."""
    from .registry import EXERCISES_DIR

    root = str(EXERCISES_DIR.resolve())
    out = []
    for name in module_names:
        path = getattr(sys.modules.get(name), "__file__", None)
        if path and str(Path(path).resolve()).startswith(root) and str(Path(path).resolve()) != str(Path(learner_file).resolve()):
            out.append(str(Path(path).resolve().relative_to(EXERCISES_DIR.resolve().parent)))
    return sorted(out)


# ---- static scan ----------------------------------------------------------------------------------
def scan(source: str, replaces: Sequence[Replace], exercise_id: str) -> List[Finding]:
    """Places where the learner's source reaches the engine's own version of a replaced symbol."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []  # reported as an import error with its own line number
    methods = {r.attr for r in replaces if r.owner}
    classes = {(r.module, r.owner) for r in replaces if r.owner}
    class_names = {owner for _, owner in classes}
    functions = {(r.module, r.attr) for r in replaces if not r.owner}
    function_names = {name for _, name in functions}
    engine_class_aliases: Dict[str, str] = {}  # local name -> engine class name
    engine_module_aliases: Dict[str, str] = {}
    found: List[Finding] = []

    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            mod = node.module
            if "solution" in mod or mod.startswith("exercises") or mod.startswith("judge"):
                found.append(Finding(node.lineno, f"imports {mod}: grade your own code, not the exercise's files"))
            if mod.startswith("minisgl"):
                for alias in node.names:
                    local = alias.asname or alias.name
                    if alias.name in class_names:
                        engine_class_aliases[local] = alias.name
                    if alias.name in function_names:
                        found.append(Finding(node.lineno, f"imports the engine's {alias.name}, the function you are writing"))
                    engine_module_aliases[local] = f"{mod}.{alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("minisgl"):
                    engine_module_aliases[alias.asname or alias.name.split(".")[0]] = alias.name

    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            base = node.value
            if node.attr in methods and isinstance(base, ast.Call) and isinstance(base.func, ast.Name) and base.func.id == "super":
                found.append(Finding(node.lineno, f"calls super().{node.attr}: that is the engine's own version of the piece you are writing"))
            elif node.attr in methods and isinstance(base, ast.Name) and base.id in engine_class_aliases:
                found.append(Finding(node.lineno, f"uses {base.id}.{node.attr}: that is the engine's own version of the piece you are writing"))
            elif node.attr in function_names and _dotted(base) is not None and _dotted(base).split(".")[0] in engine_module_aliases:
                found.append(Finding(node.lineno, f"uses {_dotted(base)}.{node.attr}: that is the engine's own version of the function you are writing"))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and ("exercises/" in node.value or node.value.endswith("solution.py")):
            found.append(Finding(node.lineno, f"names {node.value!r}: grade your own code, not the exercise's files"))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr" and len(node.args) >= 2:
            target, name = node.args[0], node.args[1]
            if isinstance(name, ast.Constant) and name.value in methods | function_names:
                if (isinstance(target, ast.Name) and (target.id in engine_class_aliases or target.id in engine_module_aliases)) or (
                    isinstance(target, ast.Call) and isinstance(target.func, ast.Name) and target.func.id == "super"
                ):
                    found.append(Finding(node.lineno, f"looks up {name.value} on the engine: that is the piece you are writing"))
    return sorted(set(found), key=lambda f: f.line)


def _dotted(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        inner = _dotted(node.value)
        return f"{inner}.{node.attr}" if inner else None
    return None
