"""Chapter 6, configuration: the environment switches and the engine's config.

Claims: `env.py` declares every environment variable once, with its meaning, and parses each by
the type of its default (a malformed value is refused with the variable's name); no module
outside `env.py` reads the process environment for a setting (a scan of the source tree); the
engine takes a `torch.dtype` as well as its name and refuses one it cannot run.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import List

import pytest
import torch

from helpers import TINY_LLAMA
from minisgl.engine import EngineConfig
from minisgl.env import EnvSwitches, declare_switches, declared_switches, read_switches, switch, variable_name
from tools.workbook_env import WorkbookSwitches

REPO = Path(__file__).resolve().parent.parent
ENV_MODULE = REPO / "minisgl" / "env.py"
WORKBOOK_ENV_MODULE = REPO / "tools" / "workbook_env.py"


def _engine_switches() -> list:
    import minisgl.distributed.group  # noqa: F401  (every module that declares switches; the
    import minisgl.kernel.cpu_gemm  # noqa: F401    kernels load only when a GPU or the CPU GEMM needs them)
    import minisgl.kernel.util  # noqa: F401
    import minisgl.llm  # noqa: F401
    import minisgl.server.api  # noqa: F401

    return declared_switches()


def test_every_switch_is_declared_with_its_meaning_and_a_name_of_its_own():
    classes = _engine_switches()
    names = [variable_name(f.name, cls) for cls in classes for f in fields(cls)]
    assert len(set(names)) == len(names), names
    for cls in classes:
        for f in fields(cls):
            assert f.metadata["help"].strip(), f"{cls.__name__}.{f.name} has no meaning declared"
    assert {"MINISGL_DISABLE_OVERLAP", "MINISGL_DISABLE_CUDA_GRAPH", "MINISGL_DISABLE_KERNELS", "MINISGL_TP_TIMEOUT",
            "TRITON_INTERPRET", "MINISGL_CPU_KV_BUDGET_GB"} <= set(names)  # Triton's own variable among them


def test_a_switch_arrives_with_the_module_it_steers():
    """Chapter 6's env.py declares only engine-wide switches; overlap's and CUDA graphs' come with them."""
    from minisgl.engine import graph
    from minisgl.scheduler import overlap

    assert {f.name for f in fields(EnvSwitches)} == {"check_integrity", "model", "log_level", "cpu_kv_budget_gb"}
    assert overlap.OverlapSwitches in _engine_switches() and graph.GraphSwitches in _engine_switches()


def test_a_second_class_declaring_a_taken_variable_is_refused():
    @dataclass(frozen=True)
    class Clash:
        model: str = field(default="", metadata=switch("the same variable again"))

    with pytest.raises(TypeError, match="MINISGL_MODEL"):
        declare_switches(Clash)
    assert Clash not in declared_switches()


def test_switches_parse_by_the_type_of_their_default():
    from minisgl.distributed.group import GroupSwitches
    from minisgl.kernel.util import KernelSwitches

    env = EnvSwitches.read({"MINISGL_CPU_KV_BUDGET_GB": "2", "MINISGL_MODEL": "/m", "UNRELATED": "x"})
    assert env == EnvSwitches(cpu_kv_budget_gb=2.0, model="/m")
    assert read_switches(KernelSwitches, {"TRITON_INTERPRET": "true"}) == KernelSwitches(triton_interpret=True)
    assert read_switches(GroupSwitches, {"MINISGL_TP_TIMEOUT": "12.5"}).tp_timeout == 12.5
    assert EnvSwitches.read({}) == EnvSwitches()
    assert read_switches(KernelSwitches, {"MINISGL_DISABLE_KERNELS": "0"}).disable_kernels is False


@pytest.mark.parametrize("name, raw", [("MINISGL_DISABLE_OVERLAP", "maybe"), ("MINISGL_TP_TIMEOUT", "soon"), ("MINISGL_NUM_THREADS", "1.5")])
def test_a_malformed_switch_is_refused_by_name(name, raw):
    from minisgl.distributed.group import GroupSwitches
    from minisgl.scheduler.overlap import OverlapSwitches

    switches = {"MINISGL_NUM_THREADS": WorkbookSwitches, "MINISGL_TP_TIMEOUT": GroupSwitches}.get(name, OverlapSwitches)
    with pytest.raises(ValueError, match=name):
        read_switches(switches, {name: raw})


def test_the_workbook_declares_its_own_switches_outside_the_engine():
    """The chapters', tests' and judge's variables are declared in tools/, read by the engine's machinery."""
    engine_names = {variable_name(f.name, cls) for cls in _engine_switches() for f in fields(cls)}
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
    assert not offenders, f"read the environment outside minisgl/env.py (declare the variable with `declare_switches`): {offenders}"


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
