"""Chapter 6, configuration: the environment switches and the engine's config.

Claims: `env.py` declares every environment variable once, with its meaning, and parses each by
the type of its default (a malformed value is refused with the variable's name); no module
outside `env.py` reads the process environment for a setting (a scan of the source tree); the
engine takes a `torch.dtype` as well as its name and refuses one it cannot run.
"""

from __future__ import annotations

import ast
from dataclasses import fields
from pathlib import Path
from typing import List

import pytest
import torch

from helpers import TINY_LLAMA
from minisgl.engine import EngineConfig
from minisgl.env import EnvSwitches, read_switches, variable_name
from tools.workbook_env import WorkbookSwitches

REPO = Path(__file__).resolve().parent.parent
ENV_MODULE = REPO / "minisgl" / "env.py"
WORKBOOK_ENV_MODULE = REPO / "tools" / "workbook_env.py"


def test_every_switch_is_declared_with_its_meaning():
    names = [variable_name(f.name) for f in fields(EnvSwitches)]
    assert len(set(names)) == len(names)
    for f in fields(EnvSwitches):
        assert f.metadata["help"].strip(), f"{f.name} has no meaning declared"
    assert variable_name("disable_overlap") == "MINISGL_DISABLE_OVERLAP"
    assert variable_name("triton_interpret") == "TRITON_INTERPRET"  # Triton's own variable


def test_switches_parse_by_the_type_of_their_default():
    env = EnvSwitches.read({"MINISGL_DISABLE_OVERLAP": "1", "TRITON_INTERPRET": "true", "MINISGL_TP_TIMEOUT": "12.5",
                            "MINISGL_CPU_KV_BUDGET_GB": "2", "MINISGL_MODEL": "/m", "UNRELATED": "x"})
    assert env == EnvSwitches(disable_overlap=True, triton_interpret=True, tp_timeout=12.5, cpu_kv_budget_gb=2.0, model="/m")
    assert EnvSwitches.read({}) == EnvSwitches()
    assert EnvSwitches.read({"MINISGL_DISABLE_OVERLAP": "0"}).disable_overlap is False


@pytest.mark.parametrize("name, raw", [("MINISGL_DISABLE_OVERLAP", "maybe"), ("MINISGL_TP_TIMEOUT", "soon"), ("MINISGL_NUM_THREADS", "1.5")])
def test_a_malformed_switch_is_refused_by_name(name, raw):
    switches = WorkbookSwitches if name == "MINISGL_NUM_THREADS" else EnvSwitches
    with pytest.raises(ValueError, match=name):
        read_switches(switches, {name: raw})


def test_the_workbook_declares_its_own_switches_outside_the_engine():
    """The chapters', tests' and judge's variables are declared in tools/, read by the engine's machinery."""
    engine_names = {variable_name(f.name) for f in fields(EnvSwitches)}
    workbook_names = {variable_name(f.name, WorkbookSwitches) for f in fields(WorkbookSwitches)}
    assert {"MINISGL_JUDGE_FORK", "MINISGL_NUM_THREADS", "MINISGL_TEST_DEVICE"} <= workbook_names
    assert not engine_names & workbook_names
    assert read_switches(WorkbookSwitches, {"MINISGL_JUDGE_FORK": "0", "MINISGL_NUM_THREADS": "3"}) == \
        WorkbookSwitches(judge_fork=False, num_threads=3)


def _environment_reads(tree: ast.AST) -> List[ast.AST]:
    """Nodes that read the process environment: `os.environ` (or a bare `environ` imported from
    os) used other than as an assignment target, and `os.getenv(...)`."""
    hits = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv") and isinstance(node.value, ast.Name) and node.value.id == "os":
            hits.append(node)
        elif isinstance(node, ast.ImportFrom) and node.module == "os" and any(a.name in ("environ", "getenv") for a in node.names):
            hits.append(node)
    return hits


def _minisgl_setting_reads(tree: ast.AST) -> List[ast.AST]:
    """Reads of a MINISGL_* variable: `os.environ.get("MINISGL_X")`, `os.getenv("MINISGL_X")`,
    `os.environ["MINISGL_X"]` (loaded, not assigned) and `"MINISGL_X" in os.environ`."""

    def is_environ(n: ast.AST) -> bool:
        return isinstance(n, ast.Attribute) and n.attr == "environ" or isinstance(n, ast.Name) and n.id == "environ"

    def names_setting(n: ast.AST) -> bool:
        return isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value.startswith("MINISGL_")

    hits = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and node.args and names_setting(node.args[0]) and isinstance(node.func, ast.Attribute):
            if node.func.attr == "getenv" or node.func.attr == "get" and is_environ(node.func.value):
                hits.append(node)
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load) and is_environ(node.value) and names_setting(node.slice):
            hits.append(node)
        elif isinstance(node, ast.Compare) and names_setting(node.left) and any(is_environ(c) for c in node.comparators):
            hits.append(node)
    return hits


def _sources(*patterns: str) -> List[Path]:
    """The checkout's own Python files: not hidden folders (the virtual environment, staged
    packages, copies of the tree), not models/ or a learner's work/."""
    def ours(p: Path) -> bool:
        parts = p.relative_to(REPO).parts
        return not any(part in ("models", "work") or part.startswith(".") and part != ".jupyter" for part in parts[:-1])
    return sorted({p for pat in patterns for p in REPO.glob(pat) if ours(p)})


def test_the_engine_reads_the_environment_only_in_env_py():
    offenders = []
    for path in _sources("minisgl/**/*.py"):
        if path == ENV_MODULE:
            continue
        for node in _environment_reads(ast.parse(path.read_text(), str(path))):
            offenders.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert not offenders, f"read the environment outside minisgl/env.py (declare the variable there): {offenders}"


def test_no_module_outside_env_py_reads_a_minisgl_setting():
    offenders = []
    for path in _sources("**/*.py", ".jupyter/*.py"):
        if path in (ENV_MODULE, WORKBOOK_ENV_MODULE):
            continue
        for node in _minisgl_setting_reads(ast.parse(path.read_text(), str(path))):
            offenders.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert not offenders, f"MINISGL_* read outside minisgl/env.py and tools/workbook_env.py: {offenders}"


def test_the_scan_sees_each_way_of_reading():
    """The scanners themselves: each form of read is caught, and writes are not."""
    reads = ['os.environ.get("MINISGL_X")', 'os.getenv("MINISGL_X", "1")', 'os.environ["MINISGL_X"]', '"MINISGL_X" in os.environ']
    for src in reads:
        assert _minisgl_setting_reads(ast.parse(src)), src
        assert _environment_reads(ast.parse(src)), src
    assert _environment_reads(ast.parse("from os import environ"))
    assert not _minisgl_setting_reads(ast.parse('os.environ["MINISGL_BIN"] = "/x"'))
    assert not _minisgl_setting_reads(ast.parse('os.environ.get("HOME")'))


@pytest.mark.parametrize("dtype, name", [(torch.float32, "float32"), (torch.bfloat16, "bfloat16"), (torch.float16, "float16"), ("bfloat16", "bfloat16")])
def test_dtype_is_a_name_or_a_torch_dtype(dtype, name):
    config = EngineConfig(model_path=str(TINY_LLAMA), device="cpu", dtype=dtype)
    assert config.dtype == name and config.torch_dtype == getattr(torch, name)


@pytest.mark.parametrize("dtype", [torch.float64, torch.int8, "fp8", "torch.float32"])
def test_an_unsupported_dtype_is_refused(dtype):
    with pytest.raises(ValueError, match="dtype must be one of"):
        EngineConfig(model_path=str(TINY_LLAMA), dtype=dtype)
