"""Helpers every chapter notebook uses.

    import book
    book.setup_chapter(4)          # `minisgl` is now the package as of chapter 4
    book.show("minisgl.core:Req")  # engine code is shown from the package, never pasted
    book.files_added(4)            # the tree of files, new ones marked

Notebooks run with chapters/ as their working directory, so `import book` finds this file.
"""

from __future__ import annotations

import functools
import html
import importlib.util
import os
import re
import sys
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, NamedTuple, Optional, Sequence, Tuple, Union

REPO = Path(__file__).resolve().parents[1]
_CHAPTER: Optional[int] = None


def _load_by_path(name: str, path: Path):
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def _stages_module():
    """tools/stages.py, loaded by path (tools/ is not a package)."""
    return _load_by_path("_minisgl_stages", REPO / "tools" / "stages.py")


def _workbook_env():
    """The workbook's own switches (`tools/workbook_env.py`), loaded by path like `_env`."""
    return _load_by_path("_workbook_env", REPO / "tools" / "workbook_env.py")


def _env():
    """The checkout's minisgl/env.py (the environment switches), loaded by path: it imports
    nothing from minisgl, and the packages of the first chapters predate it."""
    return _load_by_path("_minisgl_env", REPO / "minisgl" / "env.py")


# Weights the engines of earlier runs of a chapter hold (`minisgl.engine.engine.LOADED`), by
# checkpoint. A chapter run again imports minisgl afresh, with an empty table; handing it these
# lets its engines share the weights the old engines, still referenced by the notebook, hold.
_WEIGHTS: "weakref.WeakValueDictionary" = weakref.WeakValueDictionary()


def _purge_minisgl() -> None:
    engine = sys.modules.get("minisgl.engine.engine")
    _WEIGHTS.update(getattr(engine, "LOADED", {}))
    for name in [m for m in sys.modules if m == "minisgl" or m.startswith("minisgl.")]:
        del sys.modules[name]


def _share_earlier_weights(stage: Path) -> None:
    if _WEIGHTS and (stage / "minisgl" / "engine" / "engine.py").is_file():
        from minisgl.engine import engine

        engine.LOADED.update(_WEIGHTS)


def setup_chapter(n: int, quiet: bool = False) -> Path:
    """Make `import minisgl` give the package as of chapter n (built into .stages/ if stale).

    Modules of `minisgl` already imported in this kernel are dropped, so re-running a notebook
    after switching chapters never mixes two stages.
    """
    global _CHAPTER
    # progress bars print timings that differ run to run; notebooks keep their outputs stable
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    stages = _stages_module()
    stage = stages.build(n)
    _purge_minisgl()
    stages.isolate_finders()
    stage_root = str(REPO / ".stages")
    sys.path[:] = [p for p in sys.path if not p.startswith(stage_root)]
    sys.path.insert(0, str(stage))
    # the repo root comes last: `import judge` works, while `minisgl` still resolves to the stage
    if str(REPO) not in sys.path:
        sys.path.append(str(REPO))
    _CHAPTER = n
    _share_earlier_weights(stage)
    _register_judge_magic()
    small_llm.cache_clear()
    import torch

    torch.manual_seed(0)
    # One thread by default: a 135M model gains little from more on a laptop, every run does the
    # same arithmetic in the same order, and a busy machine cannot stall a thread team.
    torch.set_num_threads(_workbook_env().WORKBOOK.num_threads)  # MINISGL_NUM_THREADS
    if not quiet:
        device = "cuda" if torch.cuda.is_available() else "cpu"
        weights = "" if real_weights() else f"; {default_model_path().name} has random weights: its text is gibberish"
        print(f"{stages.headline(n)}); device: {device}{weights}")
    return stage


def setup_plain() -> Path:
    """Chapter 0's setup: no `minisgl` at all, the same repeatable runs as every other chapter
    (torch seeded, one thread, quiet transformers). Returns the default model's folder."""
    global _CHAPTER
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    _purge_minisgl()
    stage_root = str(REPO / ".stages")
    sys.path[:] = [p for p in sys.path if not p.startswith(stage_root)]
    _CHAPTER = 0
    import torch

    torch.manual_seed(0)
    torch.set_num_threads(_workbook_env().WORKBOOK.num_threads)  # MINISGL_NUM_THREADS
    device = "cuda" if torch.cuda.is_available() else "cpu"
    print(f"no minisgl: plain torch and safetensors; device: {device}")
    return default_model_path()


def _register_judge_magic() -> None:
    """`%%judge <id>` in a chapter's exercise cells then works without `import judge`."""
    from judge.magic import register_in_ipython

    register_in_ipython()


def chapter() -> int:
    if _CHAPTER is None:
        raise RuntimeError("call book.setup_chapter(n) first")
    return _CHAPTER


# ---------------------------------------------------------------------------------------------
# showing source


@dataclass(frozen=True)
class Source:
    """A piece of the package's source: displays highlighted, compares as plain text."""

    path: str  # "minisgl/core.py"
    first: int
    last: int
    text: str
    target: str
    chapter: int

    @property
    def caption(self) -> str:
        return f"{self.path}:{self.first}-{self.last}"

    def __repr__(self) -> str:
        return f"{self.caption}\n{self.text}"

    def _repr_html_(self) -> str:
        from pygments import highlight
        from pygments.formatters import HtmlFormatter
        from pygments.lexers import PythonLexer

        code = highlight(self.text, PythonLexer(), HtmlFormatter(noclasses=True, nobackground=True, style=_listing_style()))
        # the caption sits below the code (a negative margin would put it over the last line)
        return (
            '<div class="minisgl-src" style="margin:0.3em 0">'
            f"{code}"
            '<div style="font-size:85%;color:var(--jp-content-font-color2,#666);margin-top:0.2em">'
            f"&mdash; {html.escape(self.caption)}</div></div>"
        )

    def _repr_mimebundle_(self, include=None, exclude=None):
        data = {"text/plain": repr(self), "text/html": self._repr_html_()}
        meta = {"minisgl_show": {"target": self.target, "chapter": self.chapter}}
        return data, meta


# JupyterLab's editor colours for pygments' token kinds, beyond those jupyterlab_pygments sets
_LAB_EXTRA_COLOURS = {"Name.Function": "def", "Name.Class": "def", "Name.Builtin": "builtin",
                      "Name.Builtin.Pseudo": "builtin", "Name.Decorator": "meta", "Keyword.Constant": "keyword"}


@functools.lru_cache(maxsize=1)
def _listing_style():
    """A pygments style of JupyterLab's own code colours, which are CSS variables: a listing has
    the colours of the lab's theme, dark or light. Where the variables are not defined (another
    notebook viewer), each falls back to pygments' default colour."""
    from pygments.style import Style
    from pygments.styles.default import DefaultStyle
    from pygments.token import string_to_tokentype

    try:
        from jupyterlab_pygments import JupyterStyle
    except ImportError:  # no JupyterLab in this environment: its variables would not exist either
        return DefaultStyle
    styles = dict(JupyterStyle.styles)
    for name, kind in _LAB_EXTRA_COLOURS.items():
        token = string_to_tokentype(name)
        bold = "bold " if kind == "keyword" else ""
        styles[token] = f"{bold}var(--jp-mirror-editor-{kind}-color)"

    def with_fallback(token, spec: str) -> str:
        colour = DefaultStyle.style_for_token(token)["color"]
        return re.sub(r"var\((--[\w-]+)\)", lambda m: f"var({m.group(1)},#{colour})", spec) if colour else spec

    return type("LabListingStyle", (Style,), {"styles": {t: with_fallback(t, v) for t, v in styles.items()},
                                              "background_color": None})


def _members(body: list) -> list:
    """The statements of a module or class body, with those inside `try:` and `if` blocks (where the
    Triton kernels are defined, only when Triton imports) as if written at that level."""
    import ast

    out = []
    for stmt in body:
        if isinstance(stmt, ast.Try):
            out += _members(stmt.body + [s for h in stmt.handlers for s in h.body] + stmt.orelse + stmt.finalbody)
        elif isinstance(stmt, ast.If):
            out += _members(stmt.body + stmt.orelse)
        else:
            out.append(stmt)
    return out


def _symbol_span(tree, dotted: str, path: str) -> Tuple[int, int]:
    import ast

    body = tree.body
    node = None
    for part in dotted.split("."):
        node = None
        for cand in _members(body):
            if isinstance(cand, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and cand.name == part:
                node = cand
            elif isinstance(cand, (ast.Assign, ast.AnnAssign)):
                targets = cand.targets if isinstance(cand, ast.Assign) else [cand.target]
                if any(isinstance(t, ast.Name) and t.id == part for t in targets):
                    node = cand
        if node is None:
            raise LookupError(f"{dotted!r} is not defined in {path}: was it renamed or moved?")
        body = getattr(node, "body", [])
    first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
    return first, node.end_lineno


def source(target: str, n: Optional[int] = None) -> Source:
    """Resolve a target in the package as of chapter n (default: the current chapter).

    Targets: "minisgl.core:Req", "minisgl.core:Req.complete_one", "minisgl/scheduler/table.py"
    (whole file) or "minisgl/scheduler/table.py:10-20" (a line range).
    """
    import ast

    n = chapter() if n is None else n
    stage = _stages_module().build(n)
    spec, _, rest = target.partition(":")
    if spec.endswith(".py"):
        path = spec
    else:
        base = spec.replace(".", "/")
        path = base + ".py" if (stage / (base + ".py")).is_file() else base + "/__init__.py"
    file = stage / path
    if not file.is_file():
        raise FileNotFoundError(f"{path} is not in the package as of chapter {n}")
    lines = file.read_text().splitlines()
    if not rest:
        first, last = 1, len(lines)
    elif re.fullmatch(r"\d+-\d+", rest):
        first, last = map(int, rest.split("-"))
        if not 1 <= first <= last <= len(lines):
            raise ValueError(f"{path} has {len(lines)} lines; {rest} is out of range")
    else:
        first, last = _symbol_span(ast.parse(file.read_text()), rest, path)
    return Source(path, first, last, "\n".join(lines[first - 1 : last]), target, n)


def show(target: str) -> Source:
    """Show engine code by symbol or line range, from the package as of the current chapter."""
    return source(target)


# ---------------------------------------------------------------------------------------------
# the tree of files


class Text(str):
    """A string that displays as itself (no quotes), for trees and tables."""

    def __repr__(self) -> str:
        return str(self)


@dataclass(frozen=True)
class FileTree:
    chapter: int
    text: str

    def __repr__(self) -> str:
        return self.text

    def _repr_mimebundle_(self, include=None, exclude=None):
        return {"text/plain": self.text}, {"minisgl_files_added": {"chapter": self.chapter}}


def files_added(n: Optional[int] = None) -> FileTree:
    """The package as of chapter n: new files and files brought in early are marked."""
    n = chapter() if n is None else n
    return FileTree(n, _stages_module().tree(n))


# ---------------------------------------------------------------------------------------------
# models


def default_model_path() -> Path:
    """The bundled SmolLM2-135M-Instruct (prepared by tools/prepare_models.py), or $MINISGL_MODEL."""
    return _env().default_model_path()


def real_weights() -> bool:
    """False when the default model was built with random weights (`prepare_models.py
    --random-weights`, for machines without the SmolLM2 package): everything runs, the text is noise."""
    import json

    try:
        marker = json.loads((default_model_path() / ".prepared.json").read_text())
    except (OSError, ValueError):
        return True  # a checkpoint the user brought: nothing says otherwise
    return not marker.get("random_weights", False)


def model_path(name: str) -> Path:
    """A prepared model by folder name, e.g. "tiny-llama"."""
    path = REPO / "models" / name
    if not path.is_dir():
        raise FileNotFoundError(f"{path} is missing: run `make setup` (or python tools/prepare_models.py)")
    return path


_LLM_DEFAULTS: Dict[str, Any] = dict(max_running_reqs=8, max_seq_len=1024, cpu_kv_budget_gb=0.25)


@functools.lru_cache(maxsize=2)
def _cached_llm(chapter_n: int, items: Tuple[Tuple[str, Any], ...]):
    from minisgl.llm import LLM

    return LLM(str(default_model_path()), **dict(items))


def small_llm(**kw: Any):
    """An `LLM` on the default model with settings that suit a laptop CPU (cached per chapter).

    Keyword arguments go to `EngineConfig` and override the defaults
    (max_running_reqs=8, max_seq_len=1024, a 0.25 GB KV pool).
    """
    items = tuple(sorted({**_LLM_DEFAULTS, **kw}.items()))
    return _cached_llm(chapter(), items)


small_llm.cache_clear = _cached_llm.cache_clear  # type: ignore[attr-defined]


REFERENCE_S = 300.0  # a child that has not answered by then is stopped (it takes seconds when the CPU is free)


class Reference(NamedTuple):
    tokens: List[int]  # the greedy continuation, prompt excluded
    logits: Optional[Any]  # [vocab] float32 tensor at the prompt's last position, when asked for


def transformers_reference(prompts: Sequence[Sequence[int]], max_new_tokens: Union[int, Sequence[int]], *,
                           path: Optional[Path] = None, ignore_eos: bool = False,
                           last_logits: bool = False) -> List[Reference]:
    """What transformers' own model says for each prompt (token ids): its greedy continuation, and with
    `last_logits` the logits at the prompt's last position.

    It is `AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)` and `generate(ids,
    max_new_tokens=n, do_sample=False)` (with `min_new_tokens=n` under `ignore_eos`), run in a child
    process that exits when done: the reference model's copy of the weights never stays in this kernel.
    `path` defaults to the bundled model.
    """
    import json
    import subprocess

    import torch

    counts = [max_new_tokens] * len(prompts) if isinstance(max_new_tokens, int) else list(max_new_tokens)
    if len(counts) != len(prompts):
        raise ValueError(f"{len(prompts)} prompts but {len(counts)} values of max_new_tokens")
    job = dict(path=str(path or default_model_path()), prompts=[[int(t) for t in p] for p in prompts],
               max_new_tokens=counts, ignore_eos=ignore_eos, last_logits=last_logits)
    try:
        done = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--transformers-reference"],
                              input=json.dumps(job), capture_output=True, text=True, timeout=REFERENCE_S)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"the transformers reference did not finish within {REFERENCE_S:g} s and was stopped; "
                           "other work may be crowding the CPU: run the cell again when the machine is quieter, "
                           "or ask for fewer tokens") from None
    if done.returncode != 0:
        raise RuntimeError(f"the transformers reference failed (exit {done.returncode}):\n{done.stderr[-2000:]}")
    return [Reference(r["tokens"], None if r["logits"] is None else torch.tensor(r["logits"], dtype=torch.float32))
            for r in json.loads(done.stdout)]


def _reference_child() -> None:
    """`transformers_reference`'s child: a job as JSON on stdin, the answers as JSON on stdout."""
    import json

    import torch
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging

    logging.disable_progress_bar()
    job = json.load(sys.stdin)
    model = AutoModelForCausalLM.from_pretrained(job["path"], dtype=torch.float32)
    out = []
    with torch.no_grad():
        for ids, n in zip(job["prompts"], job["max_new_tokens"]):
            x = torch.tensor([ids])
            least = dict(min_new_tokens=n) if job["ignore_eos"] else {}
            tokens = model.generate(x, max_new_tokens=n, do_sample=False, **least)[0, len(ids):].tolist()
            logits = model(x).logits[0, -1].tolist() if job["last_logits"] else None
            out.append(dict(tokens=tokens, logits=logits))
    json.dump(out, sys.stdout)


# ---------------------------------------------------------------------------------------------
# the chapter index (the tables themselves are built by chapters/contents.py)

STAGES_OF_THE_BOOK = {0: "Overview", 1: "Stage 1 · computing correctly", 7: "Stage 2 · scheduling well",
                      12: "Stage 3 · serving", 16: "Stage 4 · faster and bigger", 22: "Wrap-up"}
ONE_LINERS = {
    0: "greedy generation with a KV cache in ~60 lines of plain torch, checked against transformers; the map of the book",
    1: "`SamplingParams`, `Req` and its three lengths through a request's life, `Batch`, the forward `Context`",
    2: "`BaseOP`, linear layers and how tensor parallelism cuts them, RMSNorm, rotary embeddings",
    3: "config, registry, one decoder for four families, a loader that merges q/k/v and gate/up on the fly",
    4: "one tensor for every layer's keys and values, addressed by slot through table rows",
    5: "the backend interface, the torch backend over a paged pool, prefill and decode masks",
    6: "an `Engine` per rank: model, KV pool sized from memory, page table, seeded sampling",
    7: "the main loop, continuous batching, `LLM.generate`",
    8: "page allocation and release, reservations, admission control",
    9: "sharing prompt prefixes between requests with a radix tree",
    10: "long prompts in slices: time to first token against time per token",
    11: "planning step N+1 while step N runs",
    12: "messages between processes and their wire format",
    13: "chat templates in, streaming text out: tokenizer and incremental detokenizer",
    14: "the scheduler as a server process over ZMQ",
    15: "an OpenAI-compatible API server and an interactive shell",
    16: "one model over several GPUs: sharded weights, all-reduce, one scheduler per rank",
    17: "FlashInfer's paged attention kernels behind the same backend interface",
    18: "capturing decode steps as CUDA graphs and replaying them",
    19: "fused Triton kernels with PyTorch fallbacks as their specification",
    20: "mixture-of-experts layers: routing, aligned blocks, fused experts",
    21: "throughput and latency benchmarks, and the memory-bandwidth floor",
    22: "minisgl beside SGLang and vLLM, two gaps measured, and a bound on cache-aware scheduling's starvation added to the engine",
}


if __name__ == "__main__" and sys.argv[1:] == ["--transformers-reference"]:
    _reference_child()
