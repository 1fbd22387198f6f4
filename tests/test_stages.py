"""The staged builds: every package file is in the manifest, and stages 1-11 run their examples.

A stage is the package as a reader has it after chapter N (tools/stages.py); its example is
tools/stage_examples/chNN.py, which asserts on real outputs (token ids against transformers,
tensors against torch), so a stage that imports but computes wrongly fails here too.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _stages():
    spec = importlib.util.spec_from_file_location("_stages_under_test", ROOT / "tools" / "stages.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


stages = _stages()


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
