"""Chapter 17: FlashInfer attention. The page list FlashInfer reads is checked against a naive
construction on the CPU, and so is which backend "auto" picks; on a GPU the backend is checked
against the PyTorch backend through the attention interface (`forward` with a real qk-norm and
RoPE: prefill with and without a cached prefix, decode of every batch size the engine routes
differently; page sizes 1 and 16), the chapter's claim about which kernel decodes (eager, and
through chapter 18's graph support) is checked against the backends, and the engine's logits are
checked end to end."""

from __future__ import annotations

import importlib.util
import json
import random
from pathlib import Path
from typing import Callable, List, Tuple

import pytest
import torch

from minisgl.attention import registry
from minisgl.attention.flashinfer_backend import flashinfer_problem, page_layout
from minisgl.attention.registry import resolve_backend_name
from minisgl.core import Batch, Req, SamplingParams
from minisgl.kernel import gather_page_indices_ref
from minisgl.kvcache.base import BaseCacheHandle
from minisgl.kvcache.mha_pool import MHAKVCache

gpu = pytest.mark.gpu


# ---- metadata (CPU) -----------------------------------------------------------------------------
@pytest.mark.parametrize("page_size", [1, 4, 16])
def test_page_layout_counts_pages_and_the_last_page_fill(page_size):
    kv_lens = [1, page_size, page_size + 1, 3 * page_size - 1, 37]
    indptr, last = page_layout(kv_lens, page_size)
    assert indptr[0] == 0 and len(indptr) == len(kv_lens) + 1
    for i, n in enumerate(kv_lens):
        pages = indptr[i + 1] - indptr[i]
        assert (pages - 1) * page_size + last[i] == n, "pages and last-page fill must add up to the length"
        assert 1 <= last[i] <= page_size


def test_page_indices_are_the_first_slot_of_each_page_over_page_size():
    ps = 4
    table = torch.zeros(3, 16, dtype=torch.int32)
    table[1, :10] = torch.tensor([8, 9, 10, 11, 36, 37, 38, 39, 4, 5])  # pages 2, 9, 1
    table[2, :3] = torch.tensor([20, 21, 22])  # page 5
    indptr, _ = page_layout([10, 3], ps)
    got = gather_page_indices_ref(table, torch.tensor([1, 2]), torch.tensor(indptr), ps, indptr[-1])
    assert got.tolist() == [2, 9, 1, 5]


def test_auto_picks_torch_on_the_cpu():
    assert resolve_backend_name("auto", torch.device("cpu")) == "torch"


def test_auto_picks_flashinfer_only_where_its_kernels_run():
    """FlashInfer needs half precision and a head_dim its kernels are built for (an H200 run showed
    head_dim 32 failing in the split-KV merge); anything else falls back to the torch backend."""
    cuda = torch.device("cuda")  # a device name only: nothing is allocated
    assert flashinfer_problem(cuda, torch.bfloat16, 128) is None
    assert "head_dim 64, 128, 256" in flashinfer_problem(cuda, torch.bfloat16, 32)
    assert "float32" in flashinfer_problem(cuda, torch.float32, 128)
    assert "CUDA" in flashinfer_problem(torch.device("cpu"), torch.bfloat16, 128)
    assert resolve_backend_name("auto", cuda, torch.float32, 128) == "torch"
    assert resolve_backend_name("auto", cuda, torch.bfloat16, 32) == "torch"
    assert resolve_backend_name("flashinfer", cuda, torch.bfloat16, 32) == "flashinfer"  # explicit: checked when built


def test_auto_on_cuda_with_flashinfer_is_the_triton_decode_backend(monkeypatch):
    """Where FlashInfer runs, "auto" takes chapter 19's backend (FlashInfer's prefill, the Triton decode
    kernel up to head_dim 128); FlashInfer by itself is chosen by name."""
    real = importlib.util.find_spec
    monkeypatch.setattr(registry.importlib.util, "find_spec", lambda name, *a: object() if name == "flashinfer" else real(name, *a))
    cuda = torch.device("cuda")
    for head_dim in (64, 128, 256):
        assert resolve_backend_name("auto", cuda, torch.bfloat16, head_dim) == "triton-decode"
    assert resolve_backend_name("auto", cuda, torch.float16, 32) == "torch"
    assert registry.backend_names() == ("auto", "torch", "flashinfer", "triton-decode")  # each registered itself


# ---- the backends against the PyTorch backend (GPU) ---------------------------------------------
HQ, HKV = 16, 8  # Qwen3-0.6B's heads: two query heads share each KV head


def make_batch(kv_cache: MHAKVCache, page_table: torch.Tensor, specs: List[Tuple[int, int]], phase: str) -> Batch:
    """Requests (cached_len, device_len) on rows 0.., each with whole pages of random slots. Page 0 is
    the dummy page: the table's last row (the dummy row) points at it, and no request gets it."""
    ps = kv_cache.page_size
    free = (torch.randperm(kv_cache.num_pages - 1) + 1).tolist()
    reqs = []
    for row, (cached, device) in enumerate(specs):
        pages = torch.tensor([free.pop() for _ in range(-(-device // ps))])
        slots = (pages[:, None] * ps + torch.arange(ps)).flatten()[:device]
        page_table[row, :device] = slots.to(page_table.device, torch.int32)
        req = Req(torch.zeros(device, dtype=torch.int32), row, cached, row, SamplingParams(max_tokens=4), BaseCacheHandle(0))
        req.device_len = device
        reqs.append(req)
    dev = page_table.device
    rows = torch.cat([torch.full((r.extend_len,), r.table_idx) for r in reqs]).to(dev)
    pos = torch.cat([torch.arange(r.cached_len, r.device_len) for r in reqs]).to(dev)
    return Batch(reqs, phase, positions=pos, out_loc=page_table[rows, pos].long())


def make_qkv(tokens: int, d: int, hq: int = HQ, hkv: int = HKV, device: str = "cuda"):
    """q, k, v as the attention layer hands them over: views of one projection output, unrotated."""
    qkv = torch.randn(tokens, (hq + 2 * hkv) * d, dtype=torch.bfloat16, device=device)
    q, k, v = qkv.split([hq * d, hkv * d, hkv * d], dim=-1)
    return q.view(tokens, hq, d), k.view(tokens, hkv, d), v.view(tokens, hkv, d)


def make_qk(d: int, qk_norm: bool, device: str = "cuda"):
    """A layer's `QKNormRope`: RoPE (theta 1e6, as Qwen3), after per-head RMSNorms if `qk_norm`."""
    from minisgl.layers.norm import RMSNorm
    from minisgl.layers.rotary import QKNormRope, RotaryEmbedding

    dev = torch.device(device)
    rope = RotaryEmbedding(d, 4096, 1e6, None, dev)
    if not qk_norm:
        return QKNormRope(rope)
    norms = [RMSNorm(d, 1e-6, dtype=torch.bfloat16, device=dev) for _ in range(2)]
    for n in norms:
        n.weight.copy_(1 + torch.randn(d, device=dev) / 4)
    return QKNormRope(rope, *norms)


def make_pool(specs: List[Tuple[int, int]], page_size: int, d: int, layers: int = 2, rows: int = 0) -> Tuple[MHAKVCache, torch.Tensor]:
    """A bfloat16 pool with room for every request's pages and the dummy page (zeroed, as the engine
    keeps it), filled with noise, and a page table of `rows` rows (at least one per request) plus the
    dummy row, as the engine's holds one per running request."""
    pages = max(4096 // page_size, sum(-(-n // page_size) for _, n in specs) + 1)
    kv = MHAKVCache(layers, pages, page_size, HKV, d, torch.bfloat16, torch.device("cuda"))
    kv.buffer.normal_()
    kv.zero_page(0)
    table = torch.zeros(max(rows, len(specs)) + 1, max(2048, max(n for _, n in specs)), dtype=torch.int32, device="cuda")
    return kv, table


def against_torch(make: Callable, specs, phase: str, page_size: int, d: int = 128, qk_norm: bool = True, layers: int = 2, seed: int = 0):
    """The torch backend's and another backend's results for one batch through `forward` (the
    attention interface the model calls), layer after layer from the same pool: each as (outputs
    `[layers, tokens, heads, d]`, the pool after), with the other backend's metadata.

    `make(kv_cache, page_table)` builds the backend under test."""
    from minisgl.attention.torch_backend import TorchAttnBackend

    torch.manual_seed(seed)
    kv, table = make_pool(specs, page_size, d, layers)
    batch = make_batch(kv, table, specs, phase)
    q, k, v = make_qkv(sum(device - cached for cached, device in specs), d)
    qk = make_qk(d, qk_norm)
    start = kv.buffer.clone()
    results = []
    for backend in (TorchAttnBackend(kv, table), make(kv, table)):
        kv.buffer.copy_(start)
        backend.prepare_metadata(batch)
        out = torch.stack([backend.forward(q, k, v, layer, batch, qk) for layer in range(layers)])
        results.append((out, kv.buffer.clone()))
    return results[0], results[1], batch.attn_metadata


def assert_matches_torch(want, got) -> None:
    """Outputs finite and within bfloat16 rounding of the torch backend's; the pool holds the same
    rotated keys and values (and nothing else moved)."""
    (want_out, want_pool), (got_out, got_pool) = want, got
    assert got_out.shape == want_out.shape and not torch.isnan(got_out).any()
    torch.testing.assert_close(got_out.float(), want_out.float(), atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(got_pool.float(), want_pool.float(), atol=2e-2, rtol=2e-2)


def flashinfer(kv, table):
    from minisgl.attention.flashinfer_backend import FlashInferAttnBackend

    return FlashInferAttnBackend(kv, table, num_qo_heads=HQ)


def decode_specs(bs: int, seed: int = 2, longest: int = 1500) -> List[Tuple[int, int]]:
    """A decode batch of `bs` requests (each one new token): one key, two, three, a long one, the rest random."""
    rng = random.Random(seed)
    lens = ([1, 2, 3, longest] + [rng.randint(1, 900) for _ in range(max(0, bs - 4))])[:bs]
    return [(n - 1, n) for n in lens]


PREFILL_SPECS = [(0, 1), (0, 37), (16, 200), (48, 49), (0, 513)]  # fresh prompts, a cached prefix, lengths off the page grid


@gpu
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("qk_norm", [True, False])
def test_prefill_matches_torch_backend(page_size, qk_norm):
    want, got, meta = against_torch(flashinfer, PREFILL_SPECS, "prefill", page_size, qk_norm=qk_norm)
    assert type(meta.wrapper).__name__ == "BatchPrefillWithPagedKVCacheWrapper"
    assert meta.num_pages == sum(-(-n // page_size) for _, n in PREFILL_SPECS)
    assert_matches_torch(want, got)


@gpu
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("bs", [1, 4, 6, 64, 160])
def test_decode_matches_torch_backend(page_size, bs):
    specs = decode_specs(bs)
    want, got, meta = against_torch(flashinfer, specs, "decode", page_size)
    assert type(meta.wrapper).__name__ == "BatchDecodeWithPagedKVCacheWrapper"
    assert meta.num_pages == sum(-(-n // page_size) for _, n in specs)
    assert_matches_torch(want, got)


# ---- which kernel decodes: the chapter's claim against the backends (GPU) ------------------------
def _decode_routes(make, d: int, max_bs: int = 160) -> dict:
    """For every decode batch size up to `max_bs`, eager and as a graph replay (padded to the engine's
    ladder of captured sizes): the metadata's type and its wrapper's, if it has one."""
    from minisgl.attention.graph_support import graph_support_for
    from minisgl.engine.graph import graph_batch_sizes

    kv, table = make_pool(decode_specs(max_bs), 16, d, layers=1)
    batch = make_batch(kv, table, decode_specs(max_bs), "decode")
    backend = make(kv, table)
    ladder = graph_batch_sizes(max_bs)
    support = graph_support_for(backend)(backend, max_bs, ladder)  # chapter 18's fixed buffers
    routes = {}
    for bs in range(1, max_bs + 1):
        sub = Batch(batch.reqs[:bs], "decode", positions=batch.positions[:bs], out_loc=batch.out_loc[:bs])
        backend.prepare_metadata(sub)
        eager = sub.attn_metadata
        support.prepare_for_replay(sub, min(size for size in ladder if size >= bs))
        for how, meta in (("eager", eager), ("graph", sub.attn_metadata)):
            wrapper = getattr(meta, "wrapper", None)
            routes[bs, how] = (type(meta).__name__, type(wrapper).__name__ if wrapper is not None else None)
    return routes


@gpu
def test_flashinfer_backend_decodes_every_batch_size_with_flashinfer():
    """Chapter 17: the FlashInfer backend plans a FlashInfer decode wrapper for every decode batch."""
    routes = _decode_routes(flashinfer, 128)
    assert set(routes.values()) == {("FlashInferMetadata", "BatchDecodeWithPagedKVCacheWrapper")}


@gpu
@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_triton_decode_backend_decodes_with_triton_up_to_head_dim_128(head_dim):
    """Chapter 17 (and 19): "auto" on CUDA runs the triton-decode backend, which decodes with the
    engine's Triton kernel at head_dim 128 and below, and with FlashInfer above."""
    from minisgl.attention.triton_decode_backend import THRESHOLDS, TritonDecodeAttnBackend

    routes = _decode_routes(lambda kv, table: TritonDecodeAttnBackend(kv, table, num_qo_heads=HQ), head_dim)
    want = ("TritonDecodeMetadata", None) if head_dim <= THRESHOLDS.max_head_dim else ("FlashInferMetadata", "BatchDecodeWithPagedKVCacheWrapper")
    assert set(routes.values()) == {want}


# ---- through the engine (GPU) -------------------------------------------------------------------
def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got - want).norm() / want.norm())


def small_qwen3(tmp_path: Path) -> str:
    """Qwen3's shape (head_dim 128, grouped KV heads, qk-norm), two layers: FlashInfer kernels
    compiled for the benchmark model serve it too."""
    cfg = json.loads((Path(__file__).resolve().parent.parent / "models" / "qwen3-0.6b-dummy" / "config.json").read_text())
    cfg.update(num_hidden_layers=2, hidden_size=256, intermediate_size=512, vocab_size=2048, max_position_embeddings=4096)
    cfg.pop("layer_types", None)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    return str(tmp_path)


def _first_logits(model: str, backend: str, prompts, page_size: int) -> torch.Tensor:
    from minisgl.llm import LLM

    llm = LLM(model, dummy_weights=True, dtype="bfloat16", attention_backend=backend, use_cuda_graph=False, page_size=page_size, max_running_reqs=8, num_pages=4096)
    seen = []
    sample = llm.engine.sampler.sample
    llm.engine.sampler.sample = lambda logits, args: (seen.append(logits.float().clone()), sample(logits, args))[1]
    llm.generate(prompts, SamplingParams(max_tokens=1))
    llm.shutdown()
    return torch.cat(seen)


@gpu
@pytest.mark.parametrize("page_size", [1, 16])
def test_engine_logits_match_torch_backend(tmp_path, page_size):
    from minisgl.engine import EngineConfig

    model = small_qwen3(tmp_path)
    rng = random.Random(0)
    prompts = [[rng.randint(0, 2000) for _ in range(n)] for n in (3, 40, 300)]
    want = _first_logits(model, "torch", prompts, page_size)
    got = _first_logits(model, "flashinfer", prompts, page_size)
    assert got.shape == (3, 2048) and not torch.isnan(got).any()
    assert rel_err(got, want) < 3e-2  # bf16 rounding through two layers, nothing more
    assert torch.equal(got.argmax(-1), want.argmax(-1))
    assert EngineConfig(model_path=model).attention_backend == "auto"


def decode_logits(model: str, prompts, backend: str) -> Tuple[torch.Tensor, torch.Tensor, str]:
    """After one prefill step of all the prompts, the first decode step, every request at once
    (through a captured graph where the backend supports graphs): the tokens the prefill chose, the
    decode step's logits (rows in the same order), and the backend's class."""
    from minisgl.llm import LLM

    llm = LLM(model, dummy_weights=True, dtype="bfloat16", attention_backend=backend, max_running_reqs=len(prompts), num_pages=1 << 16, max_extend_tokens=1 << 16)
    assert (llm.engine.graph_runner is not None) == (backend != "torch")  # the GPU backends replay graphs
    seen = []
    sample = llm.engine.sampler.sample
    llm.engine.sampler.sample = lambda logits, args: (seen.append(logits.float().clone()), sample(logits, args))[1]
    built = type(llm.engine.attn_backend).__name__
    llm.generate(prompts, SamplingParams(max_tokens=2))
    llm.shutdown()
    assert len(seen) == 2 and seen[0].shape == seen[1].shape == (len(prompts), 2048), "one prefill step, then one decode step"
    return seen[0].argmax(-1), seen[1], built


def assert_decode_logits_close(got, want) -> None:
    """`decode_logits` of two backends agree: the prefill chose the same tokens for nearly every request
    (random weights make near-ties, which bfloat16 rounding may flip), and where it did, the decode
    step's logits are within bfloat16 rounding."""
    (got_first, got_logits, _), (want_first, want_logits, _) = got, want
    assert not torch.isnan(got_logits).any()
    same = got_first == want_first
    assert same.float().mean() > 0.95
    assert rel_err(got_logits[same], want_logits[same]) < 3e-2  # bf16 rounding through two layers, nothing more
    assert (got_logits[same].argmax(-1) == want_logits[same].argmax(-1)).float().mean() > 0.95


@gpu
def test_many_requests_decode_through_graphs_like_the_torch_backend(tmp_path):
    model = small_qwen3(tmp_path)
    rng = random.Random(1)
    prompts = [[rng.randint(0, 2000) for _ in range(rng.choice([1, 2, 3, 50, 400]))] for _ in range(101)]
    want = decode_logits(model, prompts, "torch")
    got = decode_logits(model, prompts, "flashinfer")
    assert got[2] == "FlashInferAttnBackend"
    assert_decode_logits_close(got, want)


# ---- the chapter's measurement: a step of each backend (chapters/stage4.py) --------------------
def _stage4(monkeypatch):
    """chapters/stage4.py, with the chapters' folder importable (it draws with figures.py)."""
    from file_module import load_file

    chapters = Path(__file__).resolve().parent.parent / "chapters"
    monkeypatch.syspath_prepend(str(chapters))
    return load_file(chapters / "stage4.py", "_stage4_under_test")


def test_step_times_time_each_prefill_and_decode_step_of_a_backend(monkeypatch, models_dir):
    """The torch half of section 9's measurement, on the CPU: one prefill step per batch and the
    median decode step, for every batch size; the table and the figure take them; a batch that
    would not prefill in one step is refused."""
    stage4 = _stage4(monkeypatch)
    model = str(models_dir / "tiny-llama")
    rows = stage4.backend_step_times("torch", (1, 3), prompt_len=8, decode_steps=3, model=model, dtype="float32")
    assert [(r.backend, r.batch_size, r.prompt_len) for r in rows] == [("TorchAttnBackend", 1, 8), ("TorchAttnBackend", 3, 8)]
    assert all(r.prefill_s > 0 and r.decode_s > 0 for r in rows)
    runs = {"flashinfer": rows, "torch": [stage4.StepTimes("t", r.batch_size, 8, 2 * r.prefill_s, 3 * r.decode_s) for r in rows]}
    lines = stage4.step_times_table(runs).splitlines()
    assert lines[0].split() == ["batch", "backend", "prefill", "ms", "decode", "ms", "prefill", "x", "decode", "x"]
    assert [line.split()[1] for line in lines[2:]] == ["flashinfer", "torch"] * 2
    assert [line.split()[-2:] for line in lines[3::2]] == [["2.00", "3.00"]] * 2
    fig = stage4.step_times_figure(runs, "title")
    assert [ax.get_title() for ax in fig.axes] == ["one prefill step", "one decode step (median)"]
    with pytest.raises(ValueError, match="prefilled over several steps"):
        stage4.backend_step_times("torch", (64,), prompt_len=128, decode_steps=1, model=model, dtype="float32")
    if not stage4.flashinfer_ready():
        assert stage4.flashinfer_step_times().startswith("not run here")


@gpu
def test_the_chapter_measures_flashinfer_against_the_torch_backend(monkeypatch):
    """Section 9's cell, as the GPU run of the chapter makes it: the card and date first, then a row
    per batch size and backend."""
    stage4 = _stage4(monkeypatch)
    if not stage4.flashinfer_ready():
        pytest.skip("needs the flashinfer package")
    text = stage4.flashinfer_step_times(batch_sizes=(1, 4), prompt_len=64, decode_steps=4)
    lines = text.splitlines()
    assert lines[0].startswith(f"ran on {torch.cuda.get_device_name()} on ")
    assert [line.split()[:2] for line in lines[4:]] == [["1", "flashinfer"], ["1", "torch"], ["4", "flashinfer"], ["4", "torch"]]
