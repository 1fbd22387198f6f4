"""An exercise's answer and its deliberately wrong variants, derived rather than copied.

The answer (the *base*) is the starter with every stubbed piece replaced by the engine's own
source for that symbol, read from `minisgl/` at check time, so the engine's code exists once. An
exercise whose answer is not the engine's code keeps a `solution.py`, which is then the base.

`exercises/<id>/wrong.toml` declares each wrong variant as a few `old` -> `new` edits of the base:

    [[variant]]
    name = "keeps_lock"
    why = "a refused request keeps its prefix locked, so it can never be evicted"
    edits = [
      { old = "            self.cache.lock(handle, unlock=True)\\n", new = "" },
    ]

Each `old` must occur exactly once in the text it is applied to (the base with the variant's
earlier edits done); otherwise the variant is broken and `judge.py check` says which edit and why,
which is what happens when the engine's code changes under an edit.
"""

from __future__ import annotations

import ast
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from .api import Exercise, Replace
from .declaration import read_toml
from .files import write_whole
from .registry import REPO_ROOT, STATE_DIR, folder

GENERATED_DIR = STATE_DIR / "generated"  # where check writes the files its workers load


_PARSING = threading.Lock()


def _parse(source: str) -> ast.Module:
    """`ast.parse`, one thread at a time: Python 3.11's AST conversion is not thread-safe, and
    several threads materialising variants at once failed with "AST constructor recursion depth
    mismatch"."""
    with _PARSING:
        return ast.parse(source)


class VariantError(ValueError):
    """A wrong variant (or the base it edits) cannot be built; the message says which and why."""


@dataclass(frozen=True)
class Edit:
    old: str
    new: str


@dataclass(frozen=True)
class Variant:
    name: str
    why: str
    edits: Tuple[Edit, ...]


# ---- the base: the starter with the engine's pieces in place ----------------------------------------
def _module_path(module: str) -> Path:
    path = REPO_ROOT / Path(*module.split("."))
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")


def _span(lines: List[str], node: ast.AST) -> Tuple[int, int]:
    """0-based [start, end) line range of a def, decorators included."""
    start = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])]) - 1
    return start, node.end_lineno


def _find(tree: ast.Module, owner: Optional[str], attr: str) -> Optional[ast.AST]:
    body = tree.body
    if owner is not None:
        cls = next((n for n in body if isinstance(n, ast.ClassDef) and n.name == owner), None)
        if cls is None:
            return None
        body = cls.body
    return next((n for n in body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == attr), None)


def _reindent(block: List[str], indent: str) -> List[str]:
    first = block[0]
    have = first[: len(first) - len(first.lstrip())]
    return [(indent + line[len(have):]) if line.strip() else line for line in block]


def engine_source(r: Replace) -> str:
    """The engine's source text for one replaced symbol (decorators included, unindented)."""
    path = _module_path(r.module)
    lines = path.read_text().splitlines(keepends=True)
    node = _find(_parse("".join(lines)), r.owner, r.attr)
    if node is None:
        raise VariantError(f"{r.module}:{r.qualname} is not defined in {path.relative_to(REPO_ROOT)}")
    a, b = _span(lines, node)
    return "".join(_reindent(lines[a:b], ""))


def _bound_at_top(tree: ast.Module) -> Dict[str, ast.stmt]:
    out: Dict[str, ast.stmt] = {}
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            for a in node.names:
                out[a.asname or a.name.split(".")[0]] = node
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out[node.name] = node
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for t in node.targets if isinstance(node, ast.Assign) else [node.target]:
                for n in ast.walk(t):
                    if isinstance(n, ast.Name):
                        out[n.id] = node
    return out


def _free_names(source: str) -> List[str]:
    """Names a def reads that it does not bind itself (its globals, roughly)."""
    import builtins

    tree = _parse(source)
    bound = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load)}
    bound |= {a.arg for n in ast.walk(tree) if isinstance(n, ast.arguments) for a in (*n.posonlyargs, *n.args, *n.kwonlyargs, n.vararg, n.kwarg) if a}
    bound |= {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
    used = [n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)]
    return sorted({u for u in used if u not in bound and not hasattr(builtins, u)})


def _import_line(module: str, name: str, node: Optional[ast.stmt]) -> str:
    """How the answer gets `name` as the engine module has it: the engine's own import of it, or
    the engine module's global."""
    if isinstance(node, ast.Import):
        a = next(a for a in node.names if (a.asname or a.name.split(".")[0]) == name)
        return f"import {a.name}" + (f" as {a.asname}" if a.asname else "")
    if isinstance(node, ast.ImportFrom):
        a = next(a for a in node.names if (a.asname or a.name) == name)
        src = node.module or ""
        if node.level:
            pkg = module.split(".")[: -node.level] if not _module_path(module).name == "__init__.py" else module.split(".")[: len(module.split(".")) - node.level + 1]
            src = ".".join(pkg + ([node.module] if node.module else []))
        return f"from {src} import {a.name}" + (f" as {a.asname}" if a.asname else "")
    return f"from {module} import {name}"


def engine_answer(ex: Exercise) -> str:
    """The starter with each stubbed def replaced by the engine's own def of that symbol (an
    optional helper the starter leaves out is added), and the engine module's names those defs
    read imported from where the engine gets them."""
    starter = folder(ex.id) / "starter.py"
    lines = starter.read_text().splitlines(keepends=True)
    tree = _parse("".join(lines))
    spans: List[Tuple[int, int, List[str]]] = []
    needs: Dict[str, str] = {}  # name -> import line
    have = _bound_at_top(tree)
    appended: List[str] = []
    for r in ex.replaces:
        src = engine_source(r)
        engine_top = _bound_at_top(_parse(_module_path(r.module).read_text()))
        for name in _free_names(src):
            if name not in have and name in engine_top and name not in {x.attr for x in ex.replaces if not x.owner}:
                needs.setdefault(name, _import_line(r.module, name, engine_top[name]))
        node = _find(tree, r.owner, r.attr)
        if node is None and r.optional:  # a hidden helper the engine's code calls: bring the engine's
            if r.owner is None:
                appended.append("\n\n" + src)
                continue
            cls = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == r.owner), None)
            if cls is not None:
                member = cls.body[0]
                indent = lines[member.lineno - 1][: member.col_offset]
                spans.append((cls.end_lineno, cls.end_lineno, ["\n", *_reindent(src.splitlines(keepends=True), indent)]))
                continue
        if node is None:
            raise VariantError(f"{starter.relative_to(REPO_ROOT)} does not define {r.qualname}")
        a, b = _span(lines, node)
        indent = lines[a][: len(lines[a]) - len(lines[a].lstrip())]
        spans.append((a, b, _reindent(src.splitlines(keepends=True), indent)))
    for a, b, block in sorted(spans, reverse=True):
        lines[a:b] = block
    if needs:
        last_import = max((n.end_lineno for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))), default=0)
        header = "# the engine's own names that its code below reads\n" + "".join(f"{v}\n" for v in sorted(set(needs.values())))
        lines.insert(last_import, header if last_import else header + "\n")
    return "".join(lines) + "".join(appended)


def base_source(ex: Exercise) -> str:
    """What the variants edit and what must pass: solution.py where the exercise has one, else the
    engine's answer with wrong.toml's `[answer]` edits (what lets engine code run from the learner's
    module, e.g. a name the starter binds to its own subclass) applied."""
    solution = folder(ex.id) / "solution.py"
    if solution.is_file():
        return solution.read_text()
    text = engine_answer(ex)
    answer = _read(ex.id).get("answer")
    if answer is not None:
        text = apply(text, _variant("answer", answer, ex.id), f"exercises/{ex.id}/wrong.toml: ")
    return text


# ---- the variants ------------------------------------------------------------------------------------
def _read(exercise_id: str) -> dict:
    path = folder(exercise_id) / "wrong.toml"
    if not path.is_file():
        return {}
    return read_toml(path, VariantError)


def _variant(name: str, v: dict, exercise_id: str) -> Variant:
    where = f"exercises/{exercise_id}/wrong.toml"
    why, edits = v.get("why"), v.get("edits")
    if not name or not why or not edits:
        raise VariantError(f"{where}: {name or 'a variant'} needs a name, a why and at least one edit")
    if any(not isinstance(e, dict) or set(e) != {"old", "new"} for e in edits):
        raise VariantError(f"{where}: {name!r}: every edit is {{ old = ..., new = ... }}")
    return Variant(name, why, tuple(Edit(e["old"], e["new"]) for e in edits))


def declared(exercise_id: str) -> List[Variant]:
    """The wrong variants of wrong.toml, in file order."""
    out = [_variant(v.get("name", ""), v, exercise_id) for v in _read(exercise_id).get("variant", [])]
    names = [v.name for v in out]
    if len(set(names)) != len(names):
        raise VariantError(f"exercises/{exercise_id}/wrong.toml: two variants share a name")
    return out


def apply(base: str, variant: Variant, where: str = "") -> str:
    text = base
    for k, e in enumerate(variant.edits, 1):
        n = text.count(e.old)
        if n != 1:
            found = "does not occur" if n == 0 else f"occurs {n} times"
            raise VariantError(f"{where}variant {variant.name!r}, edit {k}: its old text {found} in the base (it must occur once):\n{e.old}")
        text = text.replace(e.old, e.new)
    if text == base:
        raise VariantError(f"{where}variant {variant.name!r} changes nothing")
    return text


def materialise(ex: Exercise, out_dir: Optional[Path] = None) -> Dict[str, Path]:
    """Write the base (`solution.py`) and every variant (`wrong/<name>.py`) as files a worker can
    load; keys are those names. Raises VariantError on the first edit that no longer applies.
    Safe while other processes materialise or read the same files (parallel test workers, two
    notebooks): each file is replaced whole, and only variants no longer declared are removed."""
    out_dir = out_dir or GENERATED_DIR / ex.id
    base = base_source(ex)
    where = f"exercises/{ex.id}/wrong.toml: "
    texts = {"solution.py": base}
    for v in declared(ex.id):
        texts[f"wrong/{v.name}.py"] = f"# Wrong: {v.why}\n" + apply(base, v, where)
    (out_dir / "wrong").mkdir(parents=True, exist_ok=True)
    files = {key: out_dir / key for key in texts}
    for key, text in texts.items():
        if not (files[key].exists() and files[key].read_text() == text):
            write_whole(files[key], text)
    for stale in (out_dir / "wrong").glob("*.py"):  # a variant renamed or removed since the last run
        if f"wrong/{stale.name}" not in texts:
            stale.unlink(missing_ok=True)
    return files


def solution_file(exercise_id: str) -> Path:
    """The complete answer as a file (`python judge.py answer <id>` prints it)."""
    from . import registry

    return materialise(registry.load(exercise_id))["solution.py"]


def variant_file(exercise_id: str, name: str) -> Path:
    """One declared wrong variant as a file a learner's grading would read."""
    from . import registry

    files = materialise(registry.load(exercise_id))
    if f"wrong/{name}.py" not in files:
        known = ", ".join(k[len("wrong/"):-len(".py")] for k in files if k.startswith("wrong/"))
        raise KeyError(f"{exercise_id} has no wrong variant {name!r}; it has {known}")
    return files[f"wrong/{name}.py"]

