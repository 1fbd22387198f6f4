"""The engine's code stays readable: the linter's check, short functions, plain model code, and
comments that give reasons rather than measurements (figures live in minisgl/benchmark/RESULTS.md)."""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Iterator, List, Tuple

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "minisgl"
MAX_FUNCTION_LINES = 50
# what the fast path used to thread through model and layer code; the backend owns these now
GPU_HOOKS = {"forward_normed", "forward_normed_silu_and_mul", "forward_rotating", "pending", "kv_destination", "forward_and_store"}
# a figure in a comment: microseconds, milliseconds, throughput, the card it was measured on
MEASUREMENT = re.compile(r"\b\d[\d,.]*\s?(us|ms)\b|tok/s|\bH200\b|\bround (of|\d)|fourteenth|RESULTS\.md, \"")


def _sources(folder: Path = PACKAGE) -> Iterator[Tuple[Path, str]]:
    for path in sorted(folder.rglob("*.py")):
        yield path, path.read_text()


def _ruff() -> List[str]:
    exe = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    if exe is None:
        pytest.fail("ruff is not installed: it comes with the test extra (make setup installs it)")
    return [exe]


def test_the_linter_passes_on_the_engine():
    """`ruff check minisgl` with the settings in pyproject.toml (lines up to 120 characters)."""
    run = subprocess.run(_ruff() + ["check", "--no-cache", "minisgl"], cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]


def test_the_linter_catches_a_long_line(tmp_path):
    """The check above can fail: the same settings refuse a 121-character line."""
    (tmp_path / "long.py").write_text("x = " + repr("a" * 115) + "\n")
    run = subprocess.run(_ruff() + ["check", "--no-cache", "--config", str(ROOT / "pyproject.toml"), str(tmp_path / "long.py")],
                         cwd=tmp_path, capture_output=True, text=True)
    assert run.returncode != 0 and "E501" in run.stdout


def _long_functions(src: str) -> List[str]:
    return [f"{n.name} ({n.end_lineno - n.lineno + 1} lines)" for n in ast.walk(ast.parse(src))
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.end_lineno - n.lineno + 1 > MAX_FUNCTION_LINES]


def test_no_function_in_the_engine_runs_over_fifty_lines():
    found = {str(p.relative_to(ROOT)): f for p, src in _sources() if (f := _long_functions(src))}
    assert not found, found


def test_the_length_check_sees_a_long_function():
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    assert _long_functions(f"def f():\n{body}\n") == [f"f ({MAX_FUNCTION_LINES + 1} lines)"]


@pytest.mark.parametrize("folder", ["models", "layers"])
def test_model_and_layer_code_calls_no_gpu_hook(folder):
    """Model and layer code reads like the textbook: what is fused on a GPU hides behind an op or
    the attention backend, and no method of the old fast path is defined or called here."""
    used = {}
    for path, src in _sources(PACKAGE / folder):
        for node in ast.walk(ast.parse(src)):
            name = node.attr if isinstance(node, ast.Attribute) else node.name if isinstance(node, ast.FunctionDef) else None
            if name in GPU_HOOKS:
                used.setdefault(str(path.relative_to(ROOT)), set()).add(name)
    assert not used, used


def _asks_for_kernels(src: str) -> bool:
    """Imports `minisgl.kernel` (any form) or branches on a tensor's device (`is_cuda`)."""
    return bool(re.search(r"^\s*(from|import) minisgl\.kernel|^\s*from minisgl import kernel|\.is_cuda\b", src, re.M))


@pytest.mark.parametrize("folder", ["models", "layers"])
def test_models_and_layers_ask_for_no_kernel(folder):
    """Models build from layers, and layers are the plain PyTorch reference: the kernels are swapped in by
    the pass after loading (`minisgl.kernel.swap`) or called by an attention backend."""
    found = [str(p.relative_to(ROOT)) for p, src in _sources(PACKAGE / folder) if _asks_for_kernels(src)]
    assert not found, found


def test_the_kernel_check_sees_an_import_and_a_device_branch():
    assert _asks_for_kernels("from minisgl import kernel\n") and _asks_for_kernels("from minisgl.kernel.rope import x\n")
    assert _asks_for_kernels("    if x.is_cuda:\n") and not _asks_for_kernels("import torch\n")


def _comments(src: str) -> Iterator[Tuple[int, str]]:
    """Comment lines and docstring lines, with their line numbers."""
    for i, line in enumerate(src.splitlines(), 1):
        if "#" in line:
            yield i, line[line.index("#"):]
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and ast.get_docstring(node):
            first = node.body[0].lineno
            for j, line in enumerate(ast.get_docstring(node).splitlines()):
                yield first + j, line


def test_engine_comments_quote_no_measurements():
    """Figures live in RESULTS.md with their command, machine and date; a comment gives the reason.
    (The benchmarks, which print figures, are left out.)"""
    found = [f"{p.relative_to(ROOT)}:{i}: {text.strip()}" for p, src in _sources() if "benchmark" not in p.parts
             for i, text in _comments(src) if MEASUREMENT.search(text)]
    assert not found, "\n".join(found)


def test_the_measurement_pattern_sees_a_timing():
    assert MEASUREMENT.search("# 10.7 -> 9.2 us a layer at one request") and MEASUREMENT.search("# 26,070 tok/s")
    assert not MEASUREMENT.search("# rounded to the dtype, as the reference's add")


def test_no_line_in_the_engine_runs_over_120_characters():
    """The linter's limit, counted directly: a `# noqa` cannot hide a long line from this one."""
    found = [f"{p.relative_to(ROOT)}:{i}" for p, src in _sources() for i, line in enumerate(src.splitlines(), 1) if len(line) > 120]
    assert not found, found
