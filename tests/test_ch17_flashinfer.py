"""Chapter 17: FlashInfer attention. The page metadata FlashInfer reads is checked against a
naive construction on the CPU; on a GPU the backend is checked against the PyTorch backend,
kernel by kernel (prefill with and without a cached prefix, decode; page sizes 1 and 16) and
end to end through the engine."""

from __future__ import annotations

import itertools
import json
import random
from pathlib import Path
from typing import List

import pytest
import torch

from minisgl import kernel as K
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
    assert resolve_backend_name("auto", cuda, torch.float32, 128) == "torch"
    assert resolve_backend_name("auto", cuda, torch.bfloat16, 32) == "torch"
    assert resolve_backend_name("flashinfer", cuda, torch.bfloat16, 32) == "flashinfer"  # explicit: checked when built


# ---- kernels against the PyTorch backend (GPU) --------------------------------------------------
def _batch(kv_cache: MHAKVCache, page_table: torch.Tensor, specs: List[tuple], phase: str) -> Batch:
    """Requests (cached_len, device_len) on rows 0.., each with whole pages of random slots."""
    ps = kv_cache.page_size
    free = torch.randperm(kv_cache.num_pages - 1).tolist()  # the last page is the dummy page
    reqs = []
    for row, (cached, device) in enumerate(specs):
        n_pages = -(-device // ps)
        pages = torch.tensor([free.pop() for _ in range(n_pages)])
        slots = (pages[:, None] * ps + torch.arange(ps)).flatten()[:device]
        page_table[row, :device] = slots.to(page_table.device, torch.int32)
        req = Req(torch.zeros(device, dtype=torch.int32), row, cached, row, SamplingParams(max_tokens=4), BaseCacheHandle(0))
        req.device_len = device
        reqs.append(req)
    rows = torch.cat([torch.full((r.extend_len,), r.table_idx) for r in reqs]).cuda()
    pos = torch.cat([torch.arange(r.cached_len, r.device_len) for r in reqs]).cuda()
    return Batch(reqs, phase, positions=pos, out_loc=page_table[rows, pos].long(), padded_size=len(reqs))


def _attention_both(specs, phase: str, page_size: int, tensor_cores: bool = True, small_decode_max_bs: int = 0, large_decode_min_bs: int = 1 << 30, **options):
    """The torch backend's and the FlashInfer backend's outputs over two layers, and the metadata
    FlashInfer planned for the batch (decode by FlashInfer's kernels unless the thresholds say otherwise)."""
    from minisgl.attention.flashinfer_backend import FlashInferAttnBackend
    from minisgl.attention.torch_backend import TorchAttnBackend

    torch.manual_seed(0)
    hq, hkv, d = 16, 8, 128
    pages = max(4096 // page_size, sum(-(-n // page_size) for _, n in specs) + 1)  # every request's pages, and the dummy page
    kv = MHAKVCache(2, pages, page_size, hkv, d, torch.bfloat16, torch.device("cuda"))
    kv.buffer.normal_()
    table = torch.zeros(len(specs) + 1, 2048, dtype=torch.int32, device="cuda")
    batch = _batch(kv, table, specs, phase)
    n = sum(device - cached for cached, device in specs)
    q = torch.randn(n, hq, d, dtype=torch.bfloat16, device="cuda")
    k = torch.randn(n, hkv, d, dtype=torch.bfloat16, device="cuda")
    v = torch.randn(n, hkv, d, dtype=torch.bfloat16, device="cuda")
    outs = []
    for backend in (TorchAttnBackend(kv, table), FlashInferAttnBackend(kv, table, num_qo_heads=hq, decode_tensor_cores=tensor_cores, small_decode_max_bs=small_decode_max_bs,
                                                                   large_decode_min_bs=large_decode_min_bs, **options)):
        backend.prepare_metadata(batch)
        outs.append(torch.stack([backend.forward(q, k, v, layer, batch) for layer in range(2)]))
    return outs[0], outs[1], batch.attn_metadata


def _assert_matches_torch(want: torch.Tensor, got: torch.Tensor) -> None:
    """FlashInfer's output is finite and within bfloat16 rounding of the torch backend's."""
    assert not torch.isnan(got).any()
    torch.testing.assert_close(got.float(), want.float(), atol=2e-2, rtol=2e-2)


@gpu
@pytest.mark.parametrize("page_size", [1, 16])
def test_prefill_matches_torch_backend(page_size):
    # fresh prompts, a cached prefix (radix hit or a later chunk), lengths off the page grid
    specs = [(0, 1), (0, 37), (16, 200), (48, 49), (0, 513)]
    want, got, _ = _attention_both(specs, "prefill", page_size)
    _assert_matches_torch(want, got)


@gpu
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("tensor_cores", [True, False])
def test_decode_matches_torch_backend(page_size, tensor_cores):
    specs = [(n - 1, n) for n in (1, 2, 16, 17, 300, 1025)]
    want, got, _ = _attention_both(specs, "decode", page_size, tensor_cores)
    _assert_matches_torch(want, got)


@gpu
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("tensor_cores", [True, False])
def test_decode_in_pieces_matches_torch_backend(page_size, tensor_cores):
    # requests with fewer pages than pieces (one key, two keys) keep one piece per page
    specs = [(n - 1, n) for n in (1, 2, 16, 17, 300, 1025)]
    want, got, meta = _attention_both(specs, "decode", page_size, tensor_cores, decode_pieces=4, decode_pieces_min_bs=1)
    pieces = meta.pieces
    pages = [-(-n // page_size) for _, n in specs]
    assert pieces is not None and pieces.part_start.tolist() == [0, *itertools.accumulate(min(4, p) for p in pages)]
    _assert_matches_torch(want, got)


@gpu
@pytest.mark.parametrize("page_size", [1, 16])
def test_small_decode_batches_take_the_one_launch_kernel_and_match_torch_backend(page_size):
    from minisgl.attention.flashinfer_backend import SMALL_DECODE_MAX_BS, SmallDecodeMetadata

    specs = [(n - 1, n) for n in (1, 2, 16, 17, 300, 1025)]
    want, got, _ = _attention_both(specs, "decode", page_size, small_decode_max_bs=len(specs))  # all six through the kernel
    torch.testing.assert_close(got.float(), want.float(), atol=2e-2, rtol=2e-2)
    from minisgl.attention.flashinfer_backend import FlashInferAttnBackend

    kv = MHAKVCache(1, 64, page_size, 8, 128, torch.bfloat16, torch.device("cuda"))
    table = torch.zeros(3, 64, dtype=torch.int32, device="cuda")
    backend = FlashInferAttnBackend(kv, table, num_qo_heads=16)
    batch = _batch(kv, table, [(4, 5), (0, 1)], "decode")
    assert batch.size <= SMALL_DECODE_MAX_BS  # the default threshold routes it to the kernel
    backend.prepare_metadata(batch)
    assert isinstance(batch.attn_metadata, SmallDecodeMetadata) and batch.attn_metadata.kv_lens.tolist() == [5, 1]


@gpu
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("bs", [5, 63, 64, 160])
def test_larger_decode_batches_take_the_kernel_and_match_torch_backend(page_size, bs):
    from minisgl.attention.flashinfer_backend import (DECODE_LONGEST_FIRST_MAX_BS, LARGE_DECODE_MIN_BS, LARGE_DECODE_ONE_SPLIT_MIN_BS, LARGE_DECODE_SPLITS,
                                                      SmallDecodeMetadata, large_decode_splits)

    assert LARGE_DECODE_MIN_BS <= bs  # the default threshold routes every size here to the kernel
    rng = random.Random(2)
    specs = [(n - 1, n) for n in [1, 2, 3, 1500] + [rng.randint(1, 900) for _ in range(bs - 4)]]
    want, got, meta = _attention_both(specs, "decode", page_size, large_decode_min_bs=LARGE_DECODE_MIN_BS)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    assert isinstance(meta, SmallDecodeMetadata) and meta.large
    assert meta.splits == large_decode_splits(bs, 8, sms)
    # one split a request from LARGE_DECODE_ONE_SPLIT_MIN_BS (each program writes its request's output), at least two below
    assert (meta.splits == 1) if bs >= LARGE_DECODE_ONE_SPLIT_MIN_BS else (meta.splits >= LARGE_DECODE_SPLITS)
    entries = meta.kv_lens.tolist()
    if bs <= DECODE_LONGEST_FIRST_MAX_BS:  # the kernel's entries list the requests longest first, each found again through `order`
        order = meta.order.tolist()
        assert entries == sorted(entries, reverse=True) and sorted(order) == list(range(bs))
        assert [specs[i][1] for i in order] == entries
    else:  # in the order they come
        assert meta.order is None and entries == [n for _, n in specs]
    _assert_matches_torch(want, got)


@gpu
@pytest.mark.parametrize("bs", [1, 6, 63, 64])
def test_the_decode_kernel_rotates_and_stores_up_to_its_limit(bs):
    """`forward_rotating` up to ROPE_IN_DECODE_MAX_BS requests: the output, and the keys and values it
    leaves in the pool, those of the RoPE launch then `forward`; above it, None (the layer rotates first)."""
    from minisgl.attention.flashinfer_backend import ROPE_IN_DECODE_MAX_BS, FlashInferAttnBackend
    from minisgl.layers.rotary import RotaryEmbedding

    torch.manual_seed(0)
    rng = random.Random(bs)
    hq, hkv, d = 16, 8, 128
    kv = MHAKVCache(1, 1 << 17, 1, hkv, d, torch.bfloat16, torch.device("cuda"))
    kv.buffer.normal_()
    table = torch.zeros(bs + 1, 2048, dtype=torch.int32, device="cuda")
    batch = _batch(kv, table, [(n - 1, n) for n in (rng.randint(1, 1500) for _ in range(bs))], "decode")
    backend = FlashInferAttnBackend(kv, table, num_qo_heads=hq)
    backend.prepare_metadata(batch)
    qkv = torch.randn(bs, (hq + 2 * hkv) * d, dtype=torch.bfloat16, device="cuda")
    q, k, v = (t.view(bs, -1, d) for t in qkv.split([hq * d, hkv * d, hkv * d], dim=-1))
    rope = RotaryEmbedding(d, 4096, 1e6, None, torch.device("cuda"))
    norm = (torch.randn(d, dtype=torch.bfloat16, device="cuda"), torch.randn(d, dtype=torch.bfloat16, device="cuda"), 1e-6)
    pending = K.PendingRope(batch.positions, k, v, batch.out_loc, rope._cos, rope._sin, norm)
    before = kv.buffer.clone()
    got = backend.forward_rotating(q, pending, 0, batch)
    if bs > ROPE_IN_DECODE_MAX_BS:
        assert got is None and torch.equal(kv.buffer, before)  # nothing written: the layer's RoPE launch will
        return
    got_pool = kv.buffer.clone()
    kv.buffer.copy_(before)
    q_rot = K.apply_rope_and_store(batch.positions, q, k, v, rope._cos, rope._sin, *backend.kv_destination(0), batch.out_loc, norm)
    want = backend.forward(q_rot, None, None, 0, batch)
    torch.testing.assert_close(got.float(), want.float(), atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(got_pool.float(), kv.buffer.float(), atol=2e-2, rtol=2e-2)


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


def _decode_logits(model: str, prompts, pieces: int, monkeypatch) -> torch.Tensor:
    """Logits of the first decode step (CUDA graphs on), with each request's keys in `pieces`."""
    from minisgl.attention import flashinfer_backend
    from minisgl.llm import LLM

    monkeypatch.setattr(flashinfer_backend, "DECODE_PIECES", pieces)
    llm = LLM(model, dummy_weights=True, dtype="bfloat16", attention_backend="flashinfer", max_running_reqs=len(prompts), num_pages=1 << 16, max_extend_tokens=1 << 16)  # one prefill step, then one decode step of all
    assert llm.engine.graph_runner is not None
    seen = []
    sample = llm.engine.sampler.sample
    llm.engine.sampler.sample = lambda logits, args: (seen.append(logits.float().clone()), sample(logits, args))[1]
    llm.generate(prompts, SamplingParams(max_tokens=2))
    llm.shutdown()
    return seen[-1]  # the decode step: every request at once, through a captured graph


@gpu
def test_many_requests_decode_in_pieces_through_graphs_like_whole_requests(tmp_path, monkeypatch):
    from minisgl.attention.flashinfer_backend import DECODE_PIECES_MIN_BS

    from minisgl.attention import flashinfer_backend

    monkeypatch.setattr(flashinfer_backend, "LARGE_DECODE_MIN_BS", 1 << 30)  # FlashInfer's decode, as at head_dim 256
    model = small_qwen3(tmp_path)
    rng = random.Random(1)
    prompts = [[rng.randint(0, 2000) for _ in range(rng.choice([1, 2, 3, 50, 400]))] for _ in range(DECODE_PIECES_MIN_BS + 5)]
    want = _decode_logits(model, prompts, 1, monkeypatch)
    got = _decode_logits(model, prompts, 4, monkeypatch)
    assert got.shape == (len(prompts), 2048) and not torch.isnan(got).any()
    assert rel_err(got, want) < 1e-2  # bf16 rounding of the merge, nothing more
    assert (got.argmax(-1) == want.argmax(-1)).float().mean() > 0.95


@gpu
@pytest.mark.parametrize("n", [42, 101])  # the kernel rotating as it attends, and from 64 requests not
def test_many_requests_decode_through_the_kernel_in_graphs_like_flashinfer(tmp_path, monkeypatch, n):
    from minisgl.attention import flashinfer_backend

    model = small_qwen3(tmp_path)
    rng = random.Random(3)
    prompts = [[rng.randint(0, 2000) for _ in range(rng.choice([1, 2, 3, 50, 400, 1200]))] for _ in range(n)]
    got = _decode_logits(model, prompts, flashinfer_backend.DECODE_PIECES, monkeypatch)
    monkeypatch.setattr(flashinfer_backend, "LARGE_DECODE_MIN_BS", 1 << 30)  # FlashInfer's decode, in pieces
    want = _decode_logits(model, prompts, flashinfer_backend.DECODE_PIECES, monkeypatch)
    assert got.shape == (len(prompts), 2048) and not torch.isnan(got).any()
    assert rel_err(got, want) < 1e-2
    assert (got.argmax(-1) == want.argmax(-1)).float().mean() > 0.95
