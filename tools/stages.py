"""Staged builds of the `minisgl` package: the package as a reader has it after chapter N.

    python tools/stages.py build N      # -> .stages/chNN/minisgl (rebuilt only when stale)
    python tools/stages.py tree N       # the files as of chapter N, new ones marked
    python tools/stages.py check [N]    # build stages 1..N (default 22), run each example
    python tools/stages.py unlisted     # package files missing from tools/stages.toml

Which chapter introduces which file is written down in `tools/stages.toml`. A stage holds
only the files introduced up to its chapter. Sub-package `__init__.py` files are rewritten so
that they import only modules present in the stage, and a sub-package whose own `__init__.py`
arrives later gets a one-line stand-in, so every stage imports cleanly.
"""

from __future__ import annotations

import argparse
import ast
import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import time
try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Tuple

REPO = Path(__file__).resolve().parents[1]
MANIFEST = REPO / "tools" / "stages.toml"
EXAMPLES = REPO / "tools" / "stage_examples"
STAGES = REPO / ".stages"
PACKAGE = "minisgl"
LAST_CHAPTER = 22
# bump when the way a stage is built changes, so every stamp goes stale
BUILD_VERSION = "2"


class ManifestError(ValueError):
    """tools/stages.toml is inconsistent (a file listed twice, a bad chapter number...)."""


@dataclass(frozen=True)
class Entry:
    """Where one package file enters the book."""

    path: str  # relative to the repo root, e.g. "minisgl/core.py"
    chapter: int  # the first stage that contains it
    explained_in: int  # == chapter, unless brought in early

    @property
    def early(self) -> bool:
        return self.explained_in != self.chapter


@dataclass(frozen=True)
class Manifest:
    titles: Dict[int, str]
    entries: Dict[str, Entry]
    ideas: Dict[int, Tuple[str, ...]] = field(default_factory=dict)  # chapter -> what names its idea

    def stage(self, n: int, root: Path = REPO) -> List[Entry]:
        """Entries introduced up to chapter n whose file exists, in manifest order."""
        return [e for e in self.entries.values() if e.chapter <= n and (root / e.path).is_file()]

    def planned(self, root: Path = REPO) -> List[Entry]:
        return [e for e in self.entries.values() if not (root / e.path).is_file()]


def load_manifest(path: Path = MANIFEST) -> Manifest:
    data = tomllib.loads(path.read_text())
    titles: Dict[int, str] = {}
    entries: Dict[str, Entry] = {}
    ideas: Dict[int, Tuple[str, ...]] = {}

    def add(p: str, chapter: int, explained: int) -> None:
        if p in entries:
            raise ManifestError(f"{p} is listed twice (chapters {entries[p].chapter} and {chapter})")
        if not p.startswith(PACKAGE + "/") or not p.endswith(".py"):
            raise ManifestError(f"{p}: manifest entries are .py files under {PACKAGE}/")
        entries[p] = Entry(p, chapter, explained)

    for key in sorted(data.get("chapter", {}), key=int):
        n = int(key)
        if not 1 <= n <= LAST_CHAPTER:
            raise ManifestError(f"chapter {n} is outside 1..{LAST_CHAPTER}")
        ch = data["chapter"][key]
        titles[n] = ch.get("title", "")
        if ch.get("ideas"):
            ideas[n] = tuple(ch["ideas"])
        for p in ch.get("files", []):
            add(p, n, n)
        for p, k in ch.get("early", {}).items():
            if not n < k <= LAST_CHAPTER:
                raise ManifestError(f"{p}: brought in early in chapter {n} but explained in {k}")
            add(p, n, int(k))
    return Manifest(titles, entries, ideas)


def package_files(root: Path = REPO) -> List[str]:
    """Every Python file of the real package, relative to the repo root."""
    return sorted(
        p.relative_to(root).as_posix()
        for p in (root / PACKAGE).rglob("*.py")
        if "__pycache__" not in p.parts
    )


def unlisted_files(manifest: Optional[Manifest] = None, root: Path = REPO) -> List[str]:
    manifest = manifest or load_manifest()
    return [p for p in package_files(root) if p not in manifest.entries]


# ---------------------------------------------------------------------------------------------
# rewriting __init__ files

def _module_present(dotted_parent: str, module: str, present: set[str]) -> bool:
    """Is `dotted_parent.module` (e.g. "minisgl.kvcache" + "radix_cache") in the stage?"""
    rel = "/".join([*dotted_parent.split("."), *module.split(".")])
    return f"{rel}.py" in present or any(p.startswith(rel + "/") for p in present)


def _bound_names(tree: ast.Module, dropped: set[int]) -> set[str]:
    names: set[str] = set()
    for i, node in enumerate(tree.body):
        if i in dropped:
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
    return names


def rewrite_init(text: str, package: str, present: set[str], chapter: int) -> str:
    """Drop the top-level imports of modules not in the stage and trim `__all__` to match.

    Returns the text unchanged when nothing is missing, so most stages hold byte-identical
    copies of the real files.
    """
    tree = ast.parse(text)
    dropped: set[int] = set()
    for i, node in enumerate(tree.body):
        if isinstance(node, ast.ImportFrom):
            if node.level == 1 and node.module:
                if not _module_present(package, node.module, present):
                    dropped.add(i)
            elif node.level == 0 and node.module and node.module.startswith(PACKAGE + "."):
                parent, _, mod = node.module.rpartition(".")
                if not _module_present(parent, mod, present):
                    dropped.add(i)
    if not dropped:
        return text
    lines = text.splitlines(keepends=True)
    bound = _bound_names(tree, dropped)
    edits: List[Tuple[int, int, str]] = []  # (first line, last line, replacement), 1-based
    for i in dropped:
        node = tree.body[i]
        edits.append((node.lineno, node.end_lineno, ""))
    for node in tree.body:
        if (
            isinstance(node, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets)
            and isinstance(node.value, (ast.List, ast.Tuple))
        ):
            kept = [
                e.value for e in node.value.elts
                if isinstance(e, ast.Constant) and e.value in bound
            ]
            edits.append((node.lineno, node.end_lineno, f"__all__ = {kept!r}\n"))
    for first, last, repl in sorted(edits, reverse=True):
        lines[first - 1 : last] = [repl] if repl else []
    has_future = any(
        isinstance(n, ast.ImportFrom) and n.module == "__future__" for n in tree.body
    )
    if not has_future:
        # annotations may name what was just left out: keep them unevaluated
        doc = tree.body[0] if tree.body and isinstance(tree.body[0], ast.Expr) and isinstance(
            getattr(tree.body[0], "value", None), ast.Constant) and isinstance(tree.body[0].value.value, str) else None
        at = doc.end_lineno if doc is not None else 0
        lines.insert(at, "from __future__ import annotations\n")
    header = (
        f"# staged for chapter {chapter}: imports of modules that arrive in later chapters "
        "are left out\n"
    )
    return header + "".join(lines)


def stub_init(package: str, chapter: int, arrives: int) -> str:
    return (
        f'"""{package} as of chapter {chapter}: its own __init__ arrives in chapter {arrives}; '
        'import the modules directly."""\n'
    )


# ---------------------------------------------------------------------------------------------
# building

def stage_dir(n: int) -> Path:
    return STAGES / f"ch{n:02d}"


def _stage_contents(n: int, manifest: Manifest) -> Dict[str, str]:
    """path -> text of every file in stage n, rewritten where needed (pure: no disk writes)."""
    entries = manifest.stage(n)
    present = {e.path for e in entries}
    out: Dict[str, str] = {}
    for e in entries:
        text = (REPO / e.path).read_text()
        if e.path.endswith("/__init__.py") and e.path != f"{PACKAGE}/__init__.py":
            package = e.path[: -len("/__init__.py")].replace("/", ".")
            text = rewrite_init(text, package, present, n)
        out[e.path] = text
    # sub-packages with files in this stage but whose own __init__ comes later
    dirs = {str(Path(p).parent.as_posix()) for p in present}
    for d in sorted(dirs):
        init = f"{d}/__init__.py"
        if init in out or not (REPO / init).is_file():
            continue  # present, or a namespace package in the real tree too
        arrives = manifest.entries[init].chapter if init in manifest.entries else LAST_CHAPTER
        out[init] = stub_init(d.replace("/", "."), n, arrives)
    return dict(sorted(out.items()))


def _without_reexports(text: str) -> str:
    """An __init__'s text without its imports and `__all__`."""
    tree = ast.parse(text)
    lines = text.splitlines()
    for node in tree.body:
        reexport = isinstance(node, (ast.Import, ast.ImportFrom)) or (
            isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets))
        if reexport:
            lines[node.lineno - 1 : node.end_lineno] = [""] * (node.end_lineno - node.lineno + 1)
    return "\n".join(lines)


def later_ideas(n: int, manifest: Optional[Manifest] = None,
                contents: Optional[Dict[str, str]] = None) -> List[Tuple[str, int, str]]:
    """(path, chapter, word) for every file of stage n, explained by chapter n or before, whose
    text (as the stage holds it) names an idea of a later chapter. `contents`: the stage's files
    (default: built from the manifest)."""
    manifest = manifest or load_manifest()
    contents = _stage_contents(n, manifest) if contents is None else contents
    found = []
    for path, text in contents.items():
        entry = manifest.entries.get(path)
        if entry is not None and entry.explained_in > n:
            continue  # brought in early: it belongs to its own chapter's ideas
        if path.endswith("/__init__.py"):
            text = _without_reexports(text)  # naming what the stage holds is what an __init__ is for
        for chapter, words in sorted(manifest.ideas.items()):
            found += [(path, chapter, w) for w in words if chapter > n and w in text]
    return found


def _fingerprint(contents: Dict[str, str]) -> str:
    h = hashlib.sha256(BUILD_VERSION.encode())
    for path, text in contents.items():
        h.update(path.encode() + b"\0" + text.encode() + b"\0")
    return h.hexdigest()


def build(n: int, manifest: Optional[Manifest] = None) -> Path:
    """Build stage n if stale; return the folder to put on sys.path (it holds `minisgl/`). Several
    processes may ask at once (test workers, notebooks): one builds while the others wait, so no one
    removes a stage another is importing from."""
    manifest = manifest or load_manifest()
    contents = _stage_contents(n, manifest)
    target = stage_dir(n)
    stamp = target / ".stamp"
    digest = _fingerprint(contents)
    def current() -> bool:
        return stamp.is_file() and stamp.read_text() == digest and (target / PACKAGE).is_dir()

    if current():
        return target
    STAGES.mkdir(parents=True, exist_ok=True)
    with open(STAGES / f".lock-ch{n:02d}", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if current():
            return target  # built by whoever held the lock before us
        tmp = STAGES / f".tmp-ch{n:02d}-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        for path, text in contents.items():
            dest = tmp / path
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_text(text)
        # code that finds the repo root from its own file (models/, ...) sees the same tree
        for name in ("models",):
            (tmp / name).symlink_to(Path("..") / ".." / name)
        (tmp / ".stamp").write_text(digest)
        shutil.rmtree(target, ignore_errors=True)
        tmp.rename(target)
    return target


# ---------------------------------------------------------------------------------------------
# describing a stage

def summary(n: int, manifest: Optional[Manifest] = None) -> Tuple[int, int, int]:
    """(files in stage n, new in chapter n, brought in early in chapter n)."""
    manifest = manifest or load_manifest()
    entries = manifest.stage(n)
    new = [e for e in entries if e.chapter == n]
    return len(entries), len(new), sum(e.early for e in new)


def headline(n: int, manifest: Optional[Manifest] = None) -> str:
    """"minisgl as of chapter n: T files (N new, E brought in early", without the closing parenthesis."""
    total, new, early = summary(n, manifest)
    head = f"{PACKAGE} as of chapter {n}: {total} files ({new - early} new"
    return head + (f", {early} brought in early" if early else "")


def tree(n: int, manifest: Optional[Manifest] = None) -> str:
    """The package as of chapter n; folders with nothing new are folded to one line."""
    manifest = manifest or load_manifest()
    entries = manifest.stage(n)
    explained_here = [e for e in entries if e.explained_in == n and e.chapter < n]
    head = headline(n, manifest)
    head += f", {len(explained_here)} explained here" if explained_here else ""
    lines = [head + ")", f"{PACKAGE}/"]

    def mark(e: Entry) -> str:
        if e.chapter == n and e.early:
            return f"  <- brought in early (explained in chapter {e.explained_in})"
        if e.chapter == n:
            return "  <- new"
        if e.explained_in == n:
            return f"  <- explained here (brought in at chapter {e.chapter})"
        return ""

    by_dir: Dict[str, List[Entry]] = {}
    for e in entries:
        rel = e.path[len(PACKAGE) + 1 :]
        d = rel.rpartition("/")[0]
        by_dir.setdefault(d, []).append(e)
    top = by_dir.pop("", [])
    items: List[Tuple[str, object]] = [(e.path.rpartition("/")[2], e) for e in top]
    items += [(d + "/", d) for d in sorted(by_dir)]
    for i, (name, obj) in enumerate(items):
        last = i == len(items) - 1
        branch = "└── " if last else "├── "
        if isinstance(obj, Entry):
            lines.append(f"{branch}{name}{mark(obj)}")
            continue
        files = by_dir[obj]  # type: ignore[index]
        if not any(mark(e) for e in files):
            lines.append(f"{branch}{name}  ({len(files)} files, unchanged)")
            continue
        lines.append(f"{branch}{name}")
        pad = "    " if last else "│   "
        for j, e in enumerate(files):
            b = "└── " if j == len(files) - 1 else "├── "
            lines.append(f"{pad}{b}{e.path.rpartition('/')[2]}{mark(e)}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# checking: run each chapter's example against its stage

def isolate_finders() -> None:
    """Drop the editable-install finder: it would quietly supply files missing from a stage."""
    sys.meta_path[:] = [f for f in sys.meta_path if "__editable__" not in getattr(f, "__module__", "")]


_PRELOADED: Optional[object] = None
_CHILD = r"""
import os, sys
os.chdir({cwd!r})
for fd, path in ((1, {out!r}), (2, {err!r})):
    os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), fd)
sys.argv = ["-c", *{args!r}]
exec(compile({code!r}, "<string>", "exec"), {{"__name__": "__main__"}})
"""


def run_python(code: str, args: List[str], timeout: float = 300) -> subprocess.CompletedProcess:
    """What `python -c code *args` (in the repository) gives, from a process that has already imported
    torch and transformers: each run is forked from a fork server that imported them once (it has
    imported nothing of minisgl), which saves every run those seconds of start-up."""
    import multiprocessing as mp
    import tempfile

    global _PRELOADED
    if _PRELOADED is None:
        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload(["torch", "transformers"])
        _PRELOADED = ctx
    with tempfile.TemporaryDirectory(prefix="minisgl-stage-run-") as tmp:
        out, err = os.path.join(tmp, "out"), os.path.join(tmp, "err")
        child = _PRELOADED.Process(target=exec, args=(_CHILD.format(cwd=str(REPO), out=out, err=err, args=args,
                                                                    code=code),))
        child.start()
        child.join(timeout)
        if child.is_alive():
            child.kill()
            child.join()
        read = lambda path: Path(path).read_text() if os.path.exists(path) else ""  # noqa: E731
        return subprocess.CompletedProcess(["python", "-c", "...", *args], child.exitcode, read(out), read(err))


_RUNNER = r"""
import runpy, sys
stage, example = sys.argv[1], sys.argv[2]
sys.meta_path[:] = [f for f in sys.meta_path if "__editable__" not in getattr(f, "__module__", "")]
sys.path.insert(0, stage)
import minisgl
assert minisgl.__file__.startswith(stage), f"minisgl came from {minisgl.__file__}, not the stage"
sys.argv = [example]
runpy.run_path(example, run_name="__main__")
leaked = sorted(m for m, mod in sys.modules.items()
                if m.split(".")[0] == "minisgl" and getattr(mod, "__file__", None)
                and not mod.__file__.startswith(stage))
assert not leaked, f"modules imported from outside the stage: {leaked}"
"""


@dataclass
class CheckResult:
    chapter: int
    ok: bool
    seconds: float
    output: str = ""
    skipped: str = ""


def run_example(n: int, manifest: Optional[Manifest] = None, timeout: float = 300) -> CheckResult:
    example = EXAMPLES / f"ch{n:02d}.py"
    if not example.is_file():
        return CheckResult(n, True, 0.0, skipped=f"no example {example.relative_to(REPO)}")
    stage = build(n, manifest)
    start = time.perf_counter()
    proc = run_python(_RUNNER, [str(stage), str(example)], timeout)
    return CheckResult(n, proc.returncode == 0, time.perf_counter() - start, proc.stdout + proc.stderr)


def check(upto: int = LAST_CHAPTER, verbose: bool = True) -> List[CheckResult]:
    manifest = load_manifest()
    results = []
    for n in range(1, upto + 1):
        r = run_example(n, manifest)
        results.append(r)
        if verbose:
            total, new, _ = summary(n, manifest)
            state = "skip" if r.skipped else ("ok" if r.ok else "FAIL")
            print(f"ch{n:02d} {state:<4} {total:3d} files ({new} new)  {r.seconds:5.1f}s  {r.skipped}")
            if not r.ok:
                print("    " + r.output.strip().replace("\n", "\n    "))
    if verbose:
        for e in manifest.planned():
            print(f"planned (not written yet): {e.path} (chapter {e.chapter})")
        for p in unlisted_files(manifest):
            print(f"NOT IN MANIFEST: {p}")
    return results


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="build the package as of chapter N")
    b.add_argument("n", type=int, help=f"chapter number (1..{LAST_CHAPTER})")
    t = sub.add_parser("tree", help="print the files as of chapter N")
    t.add_argument("n", type=int, help=f"chapter number (1..{LAST_CHAPTER})")
    c = sub.add_parser("check", help="build every stage up to N and run its example")
    c.add_argument("n", type=int, nargs="?", default=LAST_CHAPTER, help="last chapter to check")
    sub.add_parser("unlisted", help="list package files missing from the manifest")
    args = ap.parse_args(argv)
    if args.cmd == "build":
        print(build(args.n))
    elif args.cmd == "tree":
        print(tree(args.n))
    elif args.cmd == "check":
        results = check(args.n)
        return 0 if all(r.ok for r in results) and not unlisted_files() else 1
    elif args.cmd == "unlisted":
        missing = unlisted_files()
        print("\n".join(missing) or "every package file is listed")
        return 1 if missing else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
