"""Put a learner's piece into the real engine, and keep the engine's own version out of reach.

Three steps, in the grading subprocess only:
1. `scan` reads the learner's source: reaching the very symbol being replaced (through
   `super()`, the engine class, or an import) is reported before anything runs.
2. `hide` swaps each replaced engine symbol for a trap that raises `ReferenceUsedError`, so the
   learner's module cannot grab the reference while it is imported.
3. `transplant` sets the learner's definitions onto the engine classes and modules, so the
   engine's own code calls them from then on: for a class, everything its body defines (helper
   methods too), with `super()` in those methods answering as in an ordinary subclass.
"""

from __future__ import annotations

import ast
import builtins
import importlib
import importlib.util
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Sequence, Tuple

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


def resolve_owner(rep: Replace) -> Any:
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
        owner = resolve_owner(rep)
        original = vars(owner)[rep.attr] if rep.owner else getattr(owner, rep.attr)
        originals[rep] = original
        setattr(owner, rep.attr, _trap(rep, original))
    return originals


# What a class body defines that is machinery, not behaviour: never copied onto the engine class.
_CLASS_MACHINERY = frozenset({
    "__module__", "__qualname__", "__doc__", "__dict__", "__weakref__", "__annotations__", "__slots__",
    "__orig_bases__", "__parameters__", "__type_params__", "__static_attributes__", "__firstlineno__",
    "__classcell__", "__dataclass_fields__", "__dataclass_params__", "__match_args__", "__abstractmethods__",
    "_abc_impl", "__init_subclass__", "__class_getitem__",
})


@dataclass
class Installed:
    """What `transplant` changed: per (owner, attribute), the engine's own value (the reference,
    not its trap) and the learner's value, so a timing run can swap between them."""

    engine: Dict[Tuple[Any, str], Any] = field(default_factory=dict)
    learner: Dict[Tuple[Any, str], Any] = field(default_factory=dict)
    skipped: List[str] = field(default_factory=list)  # optional helpers the learner left out


class _EngineSuper:
    """`super()` inside a learner's method that now lives on the engine class: attributes resolve
    as they would for an ordinary subclass, first in the engine class as it was before the
    transplant (replaced symbols are traps there), then along the engine class's own bases."""

    def __init__(self, engine_cls: type, before: Dict[str, Any], obj: Any) -> None:
        object.__setattr__(self, "_judge_view", (engine_cls, before, obj))

    def __getattr__(self, name: str) -> Any:
        engine_cls, before, obj = object.__getattribute__(self, "_judge_view")
        if name in before:
            value = before[name]
            if hasattr(value, "__get__"):
                return value.__get__(None, obj) if isinstance(obj, type) else value.__get__(obj, type(obj))
            return value
        return getattr(builtins.super(engine_cls, obj), name)

    def __repr__(self) -> str:
        engine_cls, _, obj = object.__getattribute__(self, "_judge_view")
        return f"<super: {engine_cls.__name__}, {type(obj).__name__} object>"


class _SuperForTransplants:
    """Stands in for the builtin `super` in the learner's module. A learner class `L(Engine)`
    whose methods are moved onto `Engine` sees `self` as an `Engine`, not an `L`, so the builtin
    `super()` would refuse; this one answers as `super()` in an ordinary subclass would."""

    def __init__(self) -> None:
        self.classes: Dict[type, Tuple[type, Dict[str, Any]]] = {}  # learner class -> (engine class, its dict before)

    def __call__(self, *args: Any) -> Any:
        if not args:  # zero-argument form: the class cell and first argument of the calling method
            frame = sys._getframe(1)
            code = frame.f_code
            local = frame.f_locals
            if "__class__" not in local or not code.co_argcount or code.co_varnames[0] not in local:
                raise RuntimeError("super(): no arguments (call it inside a method)")
            args = (local["__class__"], local[code.co_varnames[0]])
        if len(args) == 2 and args[0] in self.classes:
            cls, obj = args
            is_mine = issubclass(obj, cls) if isinstance(obj, type) else isinstance(obj, cls)
            if not is_mine:
                engine_cls, before = self.classes[cls]
                return _EngineSuper(engine_cls, before, obj)
        return builtins.super(*args)


def load_learner(path: Path, module_name: str = "learner_solution") -> Any:
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    module.super = _SuperForTransplants()  # a module global shadows the builtin for the learner's code
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    return module


def _class_members(cls: type) -> Dict[str, Any]:
    return {k: v for k, v in vars(cls).items() if k not in _CLASS_MACHINERY}


def transplant(replaces: Sequence[Replace], learner: Any, hidden: Dict[Replace, Any]) -> Installed:
    """Install the learner's definitions. For a class, everything its body defines goes onto the
    engine class (helpers too, as an ordinary subclass would have them), and `super()` in those
    methods resolves as in that subclass. For a module-level function, the function is installed;
    the helpers it calls live in the learner's module, where its globals point."""
    done = Installed()
    real = {(resolve_owner(rep), rep.attr): value for rep, value in hidden.items()}  # the engine's own, behind the traps
    supers = vars(learner).get("super")
    owners = {}
    for rep in replaces:
        if rep.owner:
            cls = getattr(learner, rep.owner, None)
            if not isinstance(cls, type):
                if rep.optional:
                    done.skipped.append(rep.qualname)
                    continue
                raise MissingPieceError(f"your file does not define class {rep.owner} (with {rep.qualname})")
            if rep.attr not in vars(cls):
                if rep.optional:
                    done.skipped.append(rep.qualname)
                    continue
                raise MissingPieceError(f"your class {rep.owner} does not define {rep.attr}; the exercise asks for {rep.qualname}")
            owners[rep.owner] = (cls, resolve_owner(rep))
        else:
            if not hasattr(learner, rep.attr):
                if rep.optional:
                    done.skipped.append(rep.qualname)
                    continue
                raise MissingPieceError(f"your file does not define {rep.qualname}")
            target = resolve_owner(rep)
            done.engine[(target, rep.attr)] = real[(target, rep.attr)]
            done.learner[(target, rep.attr)] = getattr(learner, rep.attr)
    for cls, engine_cls in owners.values():
        if cls is engine_cls:
            continue  # the learner's file re-exported the engine class itself: nothing of theirs to install
        before = dict(vars(engine_cls))
        if isinstance(supers, _SuperForTransplants):
            supers.classes[cls] = (engine_cls, before)
        for name, value in _class_members(cls).items():
            done.engine[(engine_cls, name)] = real.get((engine_cls, name), before.get(name, _ABSENT))
            done.learner[(engine_cls, name)] = value
    for (target, name), value in done.learner.items():
        setattr(target, name, value)
    return done


_ABSENT = object()  # the engine class had no such attribute before the transplant


def swap(pieces: Dict[Tuple[Any, str], Any]) -> None:
    """Put one side of an `Installed` in place (its `engine` or its `learner` values)."""
    for (target, name), value in pieces.items():
        if value is _ABSENT:
            if name in vars(target):
                delattr(target, name)
        else:
            setattr(target, name, value)


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
