"""The staged builds: every package file is in the manifest, and stages 1-11 run their examples.

A stage is the package as a reader has it after chapter N (tools/stages.py); its example is
tools/stage_examples/chNN.py, which asserts on real outputs (token ids against transformers,
tensors against torch), so a stage that imports but computes wrongly fails here too.
"""

from __future__ import annotations

import multiprocessing
from pathlib import Path

import pytest

from file_module import load_file

ROOT = Path(__file__).resolve().parent.parent


stages = load_file(ROOT / "tools" / "stages.py", "_stages_under_test")


def test_every_package_file_is_in_the_manifest():
    missing = stages.unlisted_files()
    assert not missing, (
        f"add these files to tools/stages.toml under the chapter that introduces them: {missing}"
    )


def test_stage_holds_only_files_up_to_its_chapter():
    manifest = stages.load_manifest()
    stage = stages.build(4, manifest)
    files = {p.relative_to(stage).as_posix() for p in (stage / "minisgl").rglob("*.py")}
    assert "minisgl/kvcache/mha_pool.py" in files and "minisgl/scheduler/table.py" in files
    assert "minisgl/attention/base.py" not in files  # chapter 5
    assert "minisgl/scheduler/scheduler.py" not in files  # chapter 7
    # the scheduler package's own __init__ comes in chapter 7: a stand-in is generated
    assert "__init__ arrives in chapter 7" in (stage / "minisgl/scheduler/__init__.py").read_text()
    # kvcache's __init__ is rewritten: nothing it imports is missing from the stage
    init = (stage / "minisgl/kvcache/__init__.py").read_text()
    assert "radix_cache" not in init.split("def ")[0] and "MHAKVCache" in init


def test_build_is_stable():
    first = (stages.build(3) / ".stamp").read_text()
    again = stages._fingerprint(stages._stage_contents(3, stages.load_manifest()))
    assert first == again


def _build_and_read(folder: str, n: int) -> None:
    stages.STAGES = Path(folder)
    for _ in range(3):
        root = stages.build(n)
        files = [f for f in (root / "minisgl").rglob("*.py")]
        assert files and all(f.read_text() is not None for f in files)  # nothing vanishes under a reader


def test_stages_built_by_several_processes_at_once_stay_whole(tmp_path: Path):
    """Test workers and notebooks ask for the same stage at the same moment in a fresh checkout."""
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_build_and_read, args=(str(tmp_path), 7)) for _ in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0] * 4
    built = {str(f.relative_to(tmp_path / "ch07")) for f in (tmp_path / "ch07").rglob("*") if f.is_file()}
    expected = set(stages._stage_contents(7, stages.load_manifest())) | {".stamp"}
    assert built == expected and not list(tmp_path.glob(".tmp-*"))


def test_rewrite_init_drops_missing_imports_and_trims_all():
    text = (
        '"""doc."""\n'
        "from .a import A\n"
        "from .b import (\n    B1,\n    B2,\n)\n"
        "__all__ = ['A', 'B1', 'B2']\n"
    )
    out = stages.rewrite_init(text, "minisgl.x", {"minisgl/x/a.py"}, chapter=3)
    assert "from .b" not in out and "B1" not in out
    assert "__all__ = ['A']" in out
    namespace: dict = {}
    compile(out, "init", "exec")  # still valid Python
    assert out.index('"""doc."""') < out.index("from __future__")
    assert stages.rewrite_init(text, "minisgl.x", {"minisgl/x/a.py", "minisgl/x/b.py"}, 3) == text
    del namespace


@pytest.mark.parametrize("chapter", range(1, 12))
def test_stage_example_runs(chapter):
    result = stages.run_example(chapter)
    assert not result.skipped, result.skipped
    assert result.ok, f"stage {chapter} example failed:\n{result.output}"


# ---- "auto" inside a stage --------------------------------------------------------------------
# Each stage is asked, in a fresh interpreter, what "auto" resolves to on a machine that looks
# like a GPU machine with FlashInfer installed: `torch.cuda.is_available` reports True and the
# `flashinfer` distribution is found. Nothing is allocated on a device, so this runs on the CPU.
_PRETEND_GPU = r"""
import importlib, importlib.util, json, sys, types
import torch
stage = sys.argv[1]
sys.meta_path[:] = [f for f in sys.meta_path if "__editable__" not in getattr(f, "__module__", "")]
sys.path.insert(0, stage)
real_find_spec = importlib.util.find_spec
fake_spec = importlib.machinery.ModuleSpec("flashinfer", None)
importlib.util.find_spec = lambda name, *a: fake_spec if name == "flashinfer" else real_find_spec(name, *a)
torch.cuda.is_available = lambda: True
import minisgl
assert minisgl.__file__.startswith(stage), minisgl.__file__
from minisgl.attention.registry import resolve_backend_name
from minisgl.engine import EngineConfig
device = EngineConfig(model_path=stage).torch_device   # "auto" device: CUDA, as the machine claims
attention = resolve_backend_name("auto", device, torch.bfloat16, 64)
from minisgl.engine.engine import fast_path_names
graphs = "graph_runner" in fast_path_names()  # registered by chapter 18's graph module
if graphs:  # with a backend of the class "auto" chose (never built: no device memory here)
    from minisgl.attention import registry
    from minisgl.engine.graph import wants_cuda_graph
    backend_cls = registry._BACKENDS[attention].make  # the class registered under the name "auto" chose
    fake_engine = types.SimpleNamespace(device=device, config=types.SimpleNamespace(use_cuda_graph=True),
                                        attn_backend=object.__new__(backend_cls))
    graphs = wants_cuda_graph(fake_engine)
print(json.dumps({"device": device.type,
                  "attention": attention,
                  "graphs": graphs}))
"""


@pytest.mark.parametrize("chapter, attention, graphs", [
    (6, "torch", False),        # the first stage with an engine: neither FlashInfer nor graphs yet
    (16, "torch", False),
    (17, "flashinfer", False),  # chapter 17 adds the FlashInfer backend
    (18, "flashinfer", True),   # chapter 18 adds the graph runner
    (19, "triton-decode", True),  # chapter 19 adds the Triton-decode backend
    (21, "triton-decode", True),
])
def test_auto_resolves_among_what_the_stage_holds(chapter, attention, graphs):
    import json

    stage = stages.build(chapter)
    proc = stages.run_python(_PRETEND_GPU, [str(stage)], timeout=120)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got == {"device": "cuda", "attention": attention, "graphs": graphs}


def test_explicit_flashinfer_in_a_stage_without_it_says_what_is_missing_and_what_to_use():
    stage = stages.build(6)
    code = (
        "import sys, torch; sys.path.insert(0, sys.argv[1])\n"
        "sys.meta_path[:] = [f for f in sys.meta_path if '__editable__' not in getattr(f, '__module__', '')]\n"
        "from minisgl.attention import create_attention_backend\n"
        "from minisgl.kvcache.mha_pool import MHAKVCache\n"
        "kv = MHAKVCache(1, 4, 1, 2, 64, torch.bfloat16, torch.device('cpu'))\n"
        "create_attention_backend('flashinfer', kv, torch.zeros(2, 4, dtype=torch.int32))\n"
    )
    proc = stages.run_python(code, [str(stage)], timeout=120)
    assert proc.returncode != 0
    assert "ValueError" in proc.stderr and "unknown attention backend 'flashinfer': this package holds auto, torch;" in (
        proc.stderr)


# ---- each idea arrives in its own chapter --------------------------------------------------------
@pytest.mark.parametrize("chapter", range(1, stages.LAST_CHAPTER + 1))
def test_no_file_of_a_stage_names_an_idea_of_a_later_chapter(chapter):
    found = stages.later_ideas(chapter)
    assert not found, f"stage {chapter} shows code that names later chapters' ideas (path, chapter, word): {found}"


def test_the_idea_check_catches_a_file_that_names_a_later_idea():
    manifest = stages.load_manifest()
    assert 11 in manifest.ideas and "OverlapMixin" in manifest.ideas[11]
    text = (ROOT / "minisgl/scheduler/scheduler.py").read_text()
    bad = {"minisgl/scheduler/scheduler.py": text + "\n# see OverlapMixin\n"}
    assert stages.later_ideas(7, manifest, bad) == [("minisgl/scheduler/scheduler.py", 11, "OverlapMixin")]
    assert stages.later_ideas(12, manifest, bad) == []  # by chapter 12 overlap has been taught


def test_each_stage_composes_the_scheduler_from_the_ideas_taught_so_far():
    """The offline LLM of stage N is the scheduler with the mixins of chapters up to N."""
    code = (
        "import sys; sys.path.insert(0, sys.argv[1])\n"
        "sys.meta_path[:] = [f for f in sys.meta_path if '__editable__' not in getattr(f, '__module__', '')]\n"
        "from minisgl.scheduler import scheduler_extensions\n"
        "print(','.join(scheduler_extensions()))\n"
    )
    want = {7: "", 8: "prefix_cache", 10: "prefix_cache,chunked_prefill", 11: "prefix_cache,chunked_prefill,overlap",
            13: "prefix_cache,chunked_prefill,overlap,structured_output,logprobs",
            16: "prefix_cache,chunked_prefill,overlap,structured_output,logprobs,tensor_parallel"}
    for chapter, names in want.items():
        proc = stages.run_python(code, [str(stages.build(chapter))], timeout=120)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.strip().splitlines()[-1:] == ([names] if names else []) or (
            not names and proc.stdout.strip() == ""), (chapter, proc.stdout)
