"""Chapter 6, the engine's seams for later chapters.

Claims: `forward_batch` runs a batch through a registered fast path when that path says it can run
the batch, and through the eager forward pass otherwise (same tokens as an engine with no fast
path); a GPU engine builds its fast paths, then runs its preparation steps in registration order;
every engine runs the registered passes over its model after loading, shared weights or not;
and the engine's config has a later chapter's settings only in a package that holds that chapter's
module (chapter 6's stage has no `use_cuda_graph`, chapter 18's has).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from file_module import load_file
from helpers import TINY_LLAMA, build_engine, encode, fill_batch, make_req, map_rows
from minisgl.core import Batch
from minisgl.engine import engine as engine_module

ROOT = Path(__file__).resolve().parent.parent
PROMPTS = ["The quick brown fox", "Water boils at a temperature of"]


class FakeFastPath:
    """Runs batches of one request only, answering logits that make `token` the argmax."""

    def __init__(self, vocab: int, token: int):
        self.vocab, self.token, self.ran = vocab, token, []

    def can_run(self, batch: Batch) -> bool:
        return batch.size == 1

    def run(self, batch: Batch) -> torch.Tensor:
        self.ran.append(batch.size)
        logits = torch.zeros(batch.size, self.vocab)
        logits[:, self.token] = 1.0
        return logits


@pytest.fixture
def fake_registered(monkeypatch):
    """A fast path registered as `fake_fast` (builder and step record the order they ran in)."""
    order = []

    def build(engine):
        order.append("build")
        return FakeFastPath(engine.model_config.vocab_size, token=3)

    def step(engine):
        order.append(("step", engine.fake_fast is not None))

    monkeypatch.setitem(engine_module._FAST_PATHS, "fake_fast", ("building a fake", build, lambda config: True))
    monkeypatch.setattr(engine_module, "_GPU_STEPS", {"preparing a fake": step})
    return order


def _tokens(engine, prompts):
    reqs = [make_req(encode(p), row=i, uid=i) for i, p in enumerate(prompts)]
    map_rows(engine.page_table, engine.page_size, reqs, [r.max_device_len for r in reqs], engine.num_pages)
    batch = Batch(reqs=reqs, phase="prefill")
    fill_batch(batch, engine.page_table)
    return engine.forward_batch(batch, None).tokens.tolist()


def test_forward_batch_takes_a_fast_path_that_can_run_the_batch_else_runs_eagerly(fake_registered):
    engine = build_engine(TINY_LLAMA)
    assert "fake_fast" in engine_module.fast_path_names() and engine.fake_fast is None  # built on a GPU only
    eager_one, eager_two = _tokens(engine, PROMPTS[:1]), _tokens(engine, PROMPTS)
    assert eager_one != [3]  # the fake's answer is not what the model says
    engine.fake_fast = fast = FakeFastPath(engine.model_config.vocab_size, token=3)
    assert _tokens(engine, PROMPTS[:1]) == [3]  # one request: the fast path runs it
    assert _tokens(engine, PROMPTS) == eager_two  # two: it declines, the model runs eagerly
    assert fast.ran == [1]


def test_a_gpu_engine_builds_its_fast_paths_then_runs_its_preparation_steps(fake_registered):
    engine = build_engine(TINY_LLAMA)
    assert fake_registered == []  # a CPU engine prepares nothing
    engine._prepare_gpu()  # what a CUDA engine runs at the end of __init__
    assert fake_registered == ["build", ("step", True)]
    assert isinstance(engine.fake_fast, FakeFastPath)


_CONFIG_FIELDS = r"""
import dataclasses, json, sys
stage = sys.argv[1]
sys.meta_path[:] = [f for f in sys.meta_path if "__editable__" not in getattr(f, "__module__", "")]
sys.path.insert(0, stage)
import minisgl
assert minisgl.__file__.startswith(stage), minisgl.__file__
from minisgl.engine import EngineConfig
from minisgl.engine.engine import fast_path_names, gpu_steps, load_passes
try:
    EngineConfig(model_path=stage, use_cuda_graph=False)
    accepted = True
except TypeError:
    accepted = False
print(json.dumps({"fields": [f.name for f in dataclasses.fields(EngineConfig)], "accepted": accepted,
                  "fast_paths": list(fast_path_names()), "steps": list(gpu_steps()), "passes": list(load_passes())}))
"""


@pytest.mark.parametrize("chapter, graphs", [(6, False), (17, False), (18, True), (19, True)])
def test_the_config_has_the_graph_settings_only_where_the_graph_module_is(chapter, graphs):
    stages = load_file(ROOT / "tools" / "stages.py", "_stages_for_engine_seams")
    proc = stages.run_python(_CONFIG_FIELDS, [str(stages.build(chapter))], timeout=120)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert ("use_cuda_graph" in got["fields"], "cuda_graph_max_bs" in got["fields"], got["accepted"]) == (
        graphs, graphs, graphs)
    assert got["fast_paths"] == (["graph_runner"] if graphs else [])
    assert got["steps"] == (["compiling GPU kernels"] if graphs else [])
    # chapter 19's kernel pass registers itself; the engine's package imports it where the stage has it
    assert got["passes"] == (["swap kernels into the model's layers", "fold each layer's norms into the projections that "
                              "read them"] if chapter >= 19 else [])


def test_every_engine_runs_the_registered_passes_after_loading_shared_weights_too(monkeypatch):
    seen = []
    monkeypatch.setattr(engine_module, "_LOAD_PASSES", {"recording a pass": lambda model: seen.append(model)})
    first = build_engine(TINY_LLAMA, dummy_weights=False)
    second = build_engine(TINY_LLAMA, dummy_weights=False)  # adopts the first one's weights
    assert second.weights is first.weights and seen == [first.model, second.model]


def test_the_complete_config_is_the_base_then_each_registered_part():
    from minisgl.engine import EngineConfig
    from minisgl.engine.config import EngineConfig as Base
    from minisgl.engine.graph import GraphConfig

    names = [f.name for f in dataclasses.fields(EngineConfig)]
    assert names == [f.name for f in dataclasses.fields(Base)] + [f.name for f in dataclasses.fields(GraphConfig)]
    assert "use_cuda_graph" not in {f.name for f in dataclasses.fields(Base)}
