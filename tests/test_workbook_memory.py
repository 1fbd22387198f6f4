"""Memory on a laptop: the CPU KV pool's default size and how to raise it, and the report of each
chapter's peak resident memory (tools/chapter_memory.py) measured on a notebook of known size."""

from __future__ import annotations

from pathlib import Path

import pytest

from file_module import load_file

ROOT = Path(__file__).resolve().parent.parent
TINY = ROOT / "models" / "tiny-llama"
SMOL = ROOT / "models" / "smollm2-135m-instruct"


def _engine(monkeypatch, budget_env: str, **kw):
    """An engine built as if MINISGL_CPU_KV_BUDGET_GB=budget_env were set when minisgl started."""
    from minisgl.engine import Engine, EngineConfig, config as config_module
    from minisgl.env import EnvSwitches

    monkeypatch.setattr(config_module, "ENV", EnvSwitches.read({"MINISGL_CPU_KV_BUDGET_GB": budget_env}))
    return Engine(EngineConfig(model_path=str(TINY), device="cpu", **kw))


def test_cpu_kv_pool_default_holds_a_full_context_of_the_bundled_model_within_half_a_gib():
    import json

    import torch

    from minisgl.env import EnvSwitches
    from minisgl.kvcache.mha_pool import MHAKVCache

    assert EnvSwitches.read({}).cpu_kv_budget_gb == 0.5
    assert EnvSwitches.read({"MINISGL_CPU_KV_BUDGET_GB": "2"}).cpu_kv_budget_gb == 2.0
    if not (SMOL / "config.json").is_file():
        pytest.skip("models not prepared (run `make setup`)")
    cfg = json.loads((SMOL / "config.json").read_text())
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    per_token = MHAKVCache.bytes_per_page(cfg["num_hidden_layers"], 1, cfg["num_key_value_heads"], head_dim, torch.float32)
    context = cfg["max_position_embeddings"]
    assert context == 8192 and context * per_token <= 0.5 * 2**30, "the default must hold one full context"


def test_the_environment_raises_the_cpu_kv_budget_and_the_error_says_how(monkeypatch):
    if not (TINY / "config.json").is_file():
        pytest.skip("models not prepared (run `make setup`)")
    rows = dict(max_seq_len=256, max_running_reqs=64)
    small, large = _engine(monkeypatch, "0.001", **rows), _engine(monkeypatch, "0.004", **rows)
    assert (small.config.cpu_kv_budget_gb, large.config.cpu_kv_budget_gb) == (0.001, 0.004)
    assert large.num_pages >= 3 * small.num_pages
    for engine, budget in ((small, 0.001), (large, 0.004)):
        per_page = engine.kv_pool_bytes // (engine.num_pages + 1)  # one dummy page besides the pool's
        assert engine.num_pages * per_page <= budget * 2**30
    # a keyword (or flag) names the setting and wins over the environment
    assert _engine(monkeypatch, "0.004", cpu_kv_budget_gb=0.001, **rows).num_pages == small.num_pages
    with pytest.raises(MemoryError, match="MINISGL_CPU_KV_BUDGET_GB"):
        _engine(monkeypatch, "0.00001", max_seq_len=2048)


def test_chapter_memory_reports_a_kernels_peak(tmp_path):
    nbformat = pytest.importorskip("nbformat")
    pytest.importorskip("nbclient")
    if not Path("/proc/self/status").is_file():
        pytest.skip("reads /proc (Linux)")
    memory = load_file(ROOT / "tools" / "chapter_memory.py", "_chapter_memory_under_test")
    nb = nbformat.v4.new_notebook()
    # 400 MiB written (so resident), then freed: the peak still counts it, the end does not
    nb.cells = [nbformat.v4.new_code_cell("import numpy as np\nx = np.ones(400 * 2**20 // 8)\ndel x"),
                nbformat.v4.new_code_cell("y = 1")]
    path = tmp_path / "01_probe.ipynb"
    nbformat.write(nb, path)
    result = memory.measure(path, runs=1, cell_timeout=120)
    assert result["error"] is None
    assert 400 * 2**20 <= result["kernel"] <= result["tree"] < 2 * 2**30
    assert result["per_run"] == [result["kernel"]]  # the peak after the one run is the kernel's peak
    (big,) = memory.biggest(result["cells"], 1)  # the cell that allocated is named, and it gave the memory back
    assert big.index == 0 and big.peak >= 350 * 2**20 and big.held < 100 * 2**20 and big.first_line == "import numpy as np"
    broken = tmp_path / "02_broken.ipynb"
    nb.cells = [nbformat.v4.new_code_cell("raise ValueError('no')")]
    nbformat.write(nb, broken)
    assert memory.measure(broken, runs=2, cell_timeout=120)["error"].startswith("cell 0: ValueError")


def test_an_engine_holds_its_cpu_weights_once_and_engines_share_them():
    """On the CPU in float32 each projection is held only in oneDNN's layout (no plain copy beside
    it), with the checkpoint's values; a second engine on the same checkpoint adds no weights."""
    import torch

    from minisgl.engine import Engine, EngineConfig
    from minisgl.kernel import cpu_gemm
    from minisgl.models.weight import iter_checkpoint

    if not (TINY / "config.json").is_file():
        pytest.skip("models not prepared (run `make setup`)")
    if not cpu_gemm.ONEDNN or cpu_gemm.CPU_GEMM_ENV.disable_onednn:
        pytest.skip("oneDNN is not in this build of torch (or MINISGL_DISABLE_ONEDNN=1)")
    cfg = EngineConfig(model_path=str(TINY), device="cpu", dtype="float32", max_running_reqs=2, max_seq_len=64)
    first = Engine(cfg)
    state = first.model.state_dict()
    kinds = ("qkv_proj.weight", "o_proj.weight", "gate_up_proj.weight", "down_proj.weight")
    projections = {n: t for n, t in state.items() if n.endswith(kinds)}
    assert len(projections) == 4 * first.model_config.num_layers
    assert all(t.is_mkldnn for t in projections.values()), "a projection kept its plain copy"
    assert not state["model.embed_tokens.weight"].is_mkldnn  # the embedding's rows are looked up: it stays plain
    ckpt = dict(iter_checkpoint(TINY))
    name = "model.layers.1.self_attn.o_proj.weight"
    assert torch.equal(cpu_gemm.plain(state[name]), ckpt[name].float())
    x = torch.randn(3, state[name].shape[1])
    assert torch.equal(cpu_gemm.cpu_linear(x, state[name]), cpu_gemm.cpu_linear(x, ckpt[name].float()))
    second = Engine(cfg)
    assert all(second.model.state_dict()[n] is t for n, t in state.items())
    dummy = Engine(EngineConfig(model_path=str(TINY), device="cpu", dtype="float32", max_running_reqs=2, max_seq_len=64,
                                dummy_weights=True))
    assert dummy.model.state_dict()[name] is not state[name]  # random weights are never shared


def test_a_chapter_run_again_shares_the_weights_its_earlier_engines_hold():
    """The workbook imports minisgl afresh when a chapter runs again; engines built after that share
    the weights of the engines built before (the notebook may still hold them), and the engine
    itself keeps no table outside its own module."""
    import subprocess
    import sys

    code = f"""
import sys
sys.path.insert(0, {str(ROOT / "chapters")!r})
import book
book.setup_chapter(6, quiet=True)
from minisgl.engine import Engine, EngineConfig
first = Engine(EngineConfig(model_path={str(TINY)!r}, device="cpu", max_running_reqs=2, max_seq_len=64, num_pages=64))
book.setup_chapter(6, quiet=True)
from minisgl.engine import Engine as Again, EngineConfig as ConfigAgain
assert Again is not Engine  # a fresh import of the package
second = Again(ConfigAgain(model_path={str(TINY)!r}, device="cpu", max_running_reqs=2, max_seq_len=64, num_pages=64))
print(first.weights is second.weights, "_minisgl_loaded_weights" in sys.modules)
"""
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.split()[-2:] == ["True", "False"], run.stdout
