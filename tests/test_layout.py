"""The package's import graph: no cycles, and every import points down the layer order.

Every module under minisgl/ is parsed (nothing is imported, so this runs without the engine's
dependencies) and every import of a minisgl module is collected: at module level, inside
functions and under `if TYPE_CHECKING:` alike, since a cycle bridged by a deferred import is
still a cycle in the design. Importing `minisgl.a.b` also runs `minisgl/a/__init__.py`, so
that package counts as imported too (unless the importer lives inside it).
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Dict, List, Optional, Set

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "minisgl"

# Bottom to top. A module may import from its own package and from packages on lower lines,
# nothing else; packages on the same line are independent of each other. An entry names a
# top-level package of minisgl, or one module that sits higher than the rest of its package.
LAYERS = [
    ("env",),  # the environment variables, read once: imports nothing of minisgl
    ("utils",),  # helpers
    ("core", "distributed"),  # the request ledger and batch; which rank this is and the collectives
    ("kvcache", "layers", "message"),  # KV pool and prefix caches; model layers; inter-process messages
    ("kernel",),  # fused kernels, and the pass that swaps them in for the plain layers they replace
    ("attention", "moe", "utils.mp"),  # utils/mp.py carries `message` objects over ZMQ
    ("models",),
    ("kernel.fold",),  # the norm fold: which projection alone reads a norm is a fact of the model classes
    ("engine",),
    ("scheduler", "tokenizer"),
    ("llm", "server"),  # the front ends: offline and HTTP
    ("benchmark", "__main__", ""),  # "" is minisgl/__init__.py
]


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def package_modules(package: Path = PACKAGE) -> Dict[str, Path]:
    return {module_name(p, package.parent): p for p in sorted(package.rglob("*.py"))}


def _ancestors(name: str) -> Set[str]:
    parts = name.split(".")
    return {".".join(parts[:i]) for i in range(1, len(parts))}


def imports_of(name: str, path: Path, modules: Dict[str, Path]) -> Dict[str, int]:
    """minisgl modules that `name` imports, each with the first line that does."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]

    def known(target: str) -> str:  # `from minisgl.x import Symbol` imports the module minisgl.x
        while target not in modules:
            target = target.rpartition(".")[0]
        return target

    found: Dict[str, int] = {}
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
            full = ".".join(base + ([node.module] if node.module else []))
            targets = [f"{full}.{a.name}" if f"{full}.{a.name}" in modules else full for a in node.names]
        else:
            continue
        for target in targets:
            if target.split(".")[0] != "minisgl":
                continue
            target = known(target)
            for t in {target} | (_ancestors(target) - _ancestors(name) - {name}):
                if t != name:
                    found.setdefault(t, node.lineno)
    return found


def import_graph(package: Path = PACKAGE) -> Dict[str, Dict[str, int]]:
    modules = package_modules(package)
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def find_cycle(graph: Dict[str, Dict[str, int]]) -> Optional[List[str]]:
    """One import cycle as [a, b, ..., a], or None."""
    state: Dict[str, int] = {}  # 1: on the current path, 2: done
    path: List[str] = []

    def visit(node: str) -> Optional[List[str]]:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, {})):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def layer_of(name: str) -> tuple[int, str]:
    """(line of LAYERS, entry) for a module: the longest entry that names it or a package above it."""
    rest = name.split(".", 1)[1] if "." in name else ""
    matches = [(len(entry), i, entry) for i, line in enumerate(LAYERS) for entry in line
               if rest == entry or (entry and rest.startswith(entry + "."))]
    assert matches, f"{name}: its package is missing from LAYERS in tests/test_layout.py"
    _, i, entry = max(matches)
    return i, entry


def upward_imports(graph: Dict[str, Dict[str, int]]) -> List[str]:
    bad = []
    for name, targets in sorted(graph.items()):
        here = layer_of(name)
        for target, line in sorted(targets.items()):
            if any(t.startswith(target + ".") and l == line for t, l in targets.items()):
                continue  # the package of a module imported on this line: that module is reported
            there = layer_of(target)
            if there[1] == here[1] or there[0] < here[0]:
                continue
            bad.append(f"{name} (line {line}) imports {target}: {here[1] or 'minisgl'!r} is on layer {here[0]}, "
                       f"{there[1]!r} on layer {there[0]}")
    return bad


def _cycle_text(cycle: List[str], graph: Dict[str, Dict[str, int]]) -> str:
    return " -> ".join(f"{a} (line {graph[a][b]})" for a, b in zip(cycle, cycle[1:])) + f" -> {cycle[-1]}"


# ---- the package ------------------------------------------------------------------------------


def test_the_package_has_no_import_cycle():
    graph = import_graph()
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + _cycle_text(cycle, graph)


def test_every_import_points_down_the_layers():
    bad = upward_imports(import_graph())
    assert not bad, "imports against the layer order in tests/test_layout.py:\n" + "\n".join(bad)


def test_every_package_has_a_layer():
    for name in package_modules():
        layer_of(name)  # asserts


# ---- the checker itself, on small made-up packages ---------------------------------------------


def _write(tmp: Path, files: Dict[str, str]) -> Path:
    for rel, text in files.items():
        (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp / rel).write_text(text)
    return tmp / "minisgl"


def test_a_cycle_through_a_deferred_import_is_found(tmp_path):
    package = _write(tmp_path, {
        "minisgl/__init__.py": "",
        "minisgl/a/__init__.py": "",
        "minisgl/a/x.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from minisgl.b.y import Y\n",
        "minisgl/b/__init__.py": "from .y import Y\n",
        "minisgl/b/y.py": "def f():\n    from ..a import x\n",
    })
    graph = import_graph(package)
    assert graph["minisgl.a.x"] == {"minisgl.b.y": 3, "minisgl.b": 3}
    assert graph["minisgl.b.y"] == {"minisgl.a.x": 2, "minisgl.a": 2}
    assert find_cycle(graph) == ["minisgl.a.x", "minisgl.b", "minisgl.b.y", "minisgl.a.x"]


def test_package_init_and_relative_imports_resolve(tmp_path):
    package = _write(tmp_path, {
        "minisgl/__init__.py": "",
        "minisgl/core.py": "",
        "minisgl/a/__init__.py": "from .x import X\nfrom . import y\n",
        "minisgl/a/x.py": "from minisgl.core import Req\nimport minisgl.a.y\n",
        "minisgl/a/y.py": "from .. import core\n",
    })
    graph = import_graph(package)
    assert graph["minisgl.a"] == {"minisgl.a.x": 1, "minisgl.a.y": 2}
    assert graph["minisgl.a.x"] == {"minisgl.core": 1, "minisgl.a.y": 2}  # its own package is not an edge
    assert graph["minisgl.a.y"] == {"minisgl.core": 1}
    assert find_cycle(graph) is None


def test_an_upward_import_is_reported():
    graph = {"minisgl.core": {"minisgl.scheduler.io": 7}, "minisgl.scheduler.io": {"minisgl.core": 3},
             "minisgl.utils.mp": {"minisgl.message": 1}, "minisgl.utils.misc": {}}
    bad = upward_imports(graph)
    assert len(bad) == 1 and bad[0].startswith("minisgl.core (line 7) imports minisgl.scheduler.io")
    assert layer_of("minisgl.utils.mp")[1] == "utils.mp" and layer_of("minisgl.utils.misc")[1] == "utils"
    assert layer_of("minisgl")[1] == ""
