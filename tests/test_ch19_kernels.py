"""Chapter 19: fused kernels, the pass that swaps them into a model, and the backend built from them.
Each Triton kernel is checked against the plain PyTorch layer it replaces (the decode kernel against
the torch attention backend) under Triton's interpreter on the CPU and compiled on a GPU; the pass
against the plain model; on a GPU the triton-decode backend against the torch backend through the
attention interface, for decode batches of every regime its thresholds table names, eager and
replayed from a CUDA graph."""

from __future__ import annotations

import dataclasses
import importlib
import random
from pathlib import Path
from typing import Optional

import pytest
import torch
import torch.nn.functional as F

from minisgl import kernel as K
from minisgl.attention import triton_decode_backend as tdb
from minisgl.attention.torch_backend import TorchAttnBackend, TorchAttnMetadata
from minisgl.attention.triton_decode_backend import THRESHOLDS, DecodeThresholds
from minisgl.kernel.decode import LARGE_TILE, SMALL_TILE
from minisgl.kvcache.mha_pool import MHAKVCache
from minisgl.layers.activation import silu_and_mul
from minisgl.layers.linear import LinearColParallelMerged, LinearRowParallel
from minisgl.layers.norm import RMSNorm
from minisgl.layers.rotary import QKNormRope, RotaryEmbedding

from test_ch17_flashinfer import HQ, HKV, against_torch, assert_matches_torch, decode_specs, PREFILL_SPECS
from test_ch18_cuda_graph import graph_against_torch

gpu = pytest.mark.gpu


def _qkv(tokens: int, hq: int, hkv: int, d: int, dtype, device):
    """q, k, v as strided views of one fused projection output, as the attention layer makes them."""
    qkv = torch.randn(tokens, (hq + 2 * hkv) * d, dtype=dtype, device=device)
    q, k, v = qkv.split([hq * d, hkv * d, hkv * d], dim=-1)
    return q.view(tokens, hq, d), k.view(tokens, hkv, d), v.view(tokens, hkv, d)


def _norm(weight: torch.Tensor, eps: float = 1e-6) -> RMSNorm:
    """The plain layer with the given weight: what every norm kernel is checked against."""
    norm = RMSNorm(weight.shape[0], eps, dtype=weight.dtype, device=weight.device)
    norm.weight.copy_(weight)
    return norm


def _plain_qk(rope: RotaryEmbedding, qk_norm) -> QKNormRope:
    """The plain layers' qk-norm (when given as (q weight, k weight, eps)) and RoPE."""
    if qk_norm is None:
        return QKNormRope(rope)
    return QKNormRope(rope, _norm(qk_norm[0], qk_norm[2]), _norm(qk_norm[1], qk_norm[2]))


# ---- the plain paths the engine keeps where no kernel applies (CPU) --------------------------
def test_store_kv_ref_writes_each_token_to_its_slot():
    _, k, v = _qkv(6, 2, 2, 8, torch.float32, "cpu")
    k_cache, v_cache = torch.full((20, 2, 8), float("nan")), torch.full((20, 2, 8), float("nan"))
    loc = torch.tensor([3, 17, 0, 9, 4, 11])
    K.store_kv(k, v, k_cache, v_cache, loc)
    for i, slot in enumerate(loc.tolist()):
        assert torch.equal(k_cache[slot], k[i]) and torch.equal(v_cache[slot], v[i])
    untouched = torch.ones(20, dtype=torch.bool)
    untouched[loc] = False
    assert torch.isnan(k_cache[untouched]).all(), "a slot that was not in out_loc was written"


def test_gather_page_indices_ref_matches_a_loop():
    ps = 4
    pages = torch.randperm(5 * 64 // ps)
    table = (pages.view(5, -1, 1) * ps + torch.arange(ps)).view(5, 64).to(torch.int32)  # whole pages per row
    rows = torch.tensor([4, 1, 2], dtype=torch.int32)
    kv_lens = [9, 1, 64]
    pages = [-(-n // ps) for n in kv_lens]
    indptr = torch.tensor([0, *torch.tensor(pages).cumsum(0).tolist()], dtype=torch.int32)
    got = K.gather_page_indices(table, rows, indptr, ps, sum(pages), max(pages))
    want = [int(table[r, j * ps]) // ps for r, n in zip(rows.tolist(), pages) for j in range(n)]
    assert got.tolist() == want


def test_no_kernel_takes_cpu_tensors_outside_the_interpreter():
    """On the CPU (without TRITON_INTERPRET) every `*_fits` check says no, so each kernel-backed layer runs
    the plain layer's forward."""
    x, w = torch.randn(3, 16), torch.randn(16)
    q, k, v = _qkv(3, 2, 1, 16, torch.float32, "cpu")
    rope = RotaryEmbedding(16, 64, 10000.0, None, torch.device("cpu"))
    assert not (K.rmsnorm_fits(x, w) or K.add_rmsnorm_fits(x, x, w) or K.silu_and_mul_fits(x))
    assert not (K.rope_fits(q, k, rope.cos, rope.sin) or K.gemv_applies(x.bfloat16(), torch.randn(4, 16).bfloat16()))


# ---- Triton kernels against the layers (GPU) ------------------------------------------------
DTYPES = [torch.bfloat16, torch.float32]


def _close(got: torch.Tensor, want: torch.Tensor, dtype, tol: Optional[float] = None) -> None:
    assert not torch.isnan(got).any()
    tol = tol if tol is not None else 1e-2 if dtype == torch.bfloat16 else 1e-5
    torch.testing.assert_close(got.float(), want.float(), atol=tol, rtol=tol)


@gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_store_kv_kernel(dtype):
    # against the KV pool's own store (chapter 4), the plain code the kernel replaces
    q, k, v = _qkv(37, 16, 8, 128, dtype, "cuda")
    pool = MHAKVCache(1, 1000, 1, 8, 128, dtype, torch.device("cuda"))
    pool.buffer.fill_(float("nan"))
    k_cache, v_cache = pool.k_cache(0).clone(), pool.v_cache(0).clone()
    loc = torch.randperm(1000, device="cuda")[:37]
    pool.store_kv(k, v, loc, 0)
    want_k, want_v = pool.k_cache(0), pool.v_cache(0)
    K.store_kv(k, v, k_cache, v_cache, loc)
    assert torch.equal(k_cache.nan_to_num(7.0), want_k.nan_to_num(7.0)) and torch.equal(v_cache.nan_to_num(7.0), want_v.nan_to_num(7.0))


@gpu
@pytest.mark.parametrize("page_size", [1, 16])
def test_gather_page_indices_kernel(page_size):
    rows, seq = 9, 2048
    pages = torch.randperm(rows * seq // page_size, device="cuda")
    table = (pages.view(rows, -1, 1) * page_size + torch.arange(page_size, device="cuda")).view(rows, seq).to(torch.int32)
    batch_rows = torch.tensor([8, 0, 3, 5], dtype=torch.int32, device="cuda")
    kv_lens = [1, 700, 2048, 33]
    counts = [-(-n // page_size) for n in kv_lens]
    indptr = torch.tensor([0, *torch.tensor(counts).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    total = sum(counts)
    got = K.gather_page_indices(table, batch_rows, indptr, page_size, total, max(counts), out=torch.full((total + 5,), -1, dtype=torch.int32, device="cuda"))
    assert torch.equal(got[:total], K.gather_page_indices_ref(table, batch_rows, indptr, page_size, total))
    assert (got[total:] == -1).all()


@gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_norm_kernels(dtype):
    w = torch.randn(1024, dtype=dtype, device="cuda")
    x, r = torch.randn(77, 1024, dtype=dtype, device="cuda"), torch.randn(77, 1024, dtype=dtype, device="cuda")
    norm = _norm(w)
    _close(K.rmsnorm(x, w, 1e-6), norm.forward(x), dtype)
    out, s = K.fused_add_rmsnorm(x, r, w, 1e-6)
    want_out, want_s = norm.forward_residual(x, r)
    assert torch.equal(s, want_s)
    _close(out, want_out, dtype)
    q, k, _ = _qkv(77, 16, 8, 128, dtype, "cuda")  # per-head norm on strided views
    head_norm = _norm(torch.randn(128, dtype=dtype, device="cuda"))
    _close(K.rmsnorm(q, head_norm.weight, 1e-6), head_norm.forward(q), dtype)
    _close(K.rmsnorm(k, head_norm.weight, 1e-6), head_norm.forward(k), dtype)


def _rope_inputs(dtype):
    """A 128-wide rotary table (theta 1e6, 4096 positions) and 50 tokens of 16 query / 8 KV heads
    at random positions, on the GPU."""
    rope = RotaryEmbedding(128, 4096, 1e6, None, torch.device("cuda"))
    q, k, _ = _qkv(50, 16, 8, 128, dtype, "cuda")
    return rope, q, k, torch.randint(0, 4096, (50,), device="cuda")


@gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_rope_kernel(dtype):
    rope, q, k, pos = _rope_inputs(dtype)
    for got, want in zip(K.apply_rope(pos, q, k, rope.cos, rope.sin), rope.forward(pos, q, k)):
        _close(got, want, dtype)


@gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_rope_kernel_with_qk_norm_is_norm_then_rope(dtype):
    """Qwen3's qk-norm folded into the rope launch computes what the two layers compute apart."""
    rope, q, k, pos = _rope_inputs(dtype)
    wq, wk = torch.randn(128, dtype=dtype, device="cuda"), torch.randn(128, dtype=dtype, device="cuda")
    got = K.apply_rope(pos, q, k, rope.cos, rope.sin, (wq, wk, 1e-6))
    want = _plain_qk(rope, (wq, wk, 1e-6))(pos, q, k)
    for g, w in zip(got, want):
        _close(g, w, dtype)


@gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_and_mul_kernel(dtype):
    x = torch.randn(33, 2 * 3072, dtype=dtype, device="cuda")
    _close(K.silu_and_mul(x), silu_and_mul(x), dtype)
    assert torch.equal(K.silu_and_mul(x[:0]), silu_and_mul(x[:0]))


def _plain_rope_and_store(positions, q, k, v, rope, k_cache, v_cache, out_loc, qk_norm) -> torch.Tensor:
    """The plain sequence `apply_rope_and_store` fuses: the layers' qk-norm and RoPE, then the store as
    the KV pool writes it; returns the rotated q."""
    q, k = _plain_qk(rope, qk_norm)(positions, q, k)
    k_cache.index_copy_(0, out_loc, k)
    v_cache.index_copy_(0, out_loc, v)
    return q


def _rope_store_case(dtype, device, tokens=9, hq=4, hkv=2, d=64, qk_norm=True):
    """(got, want): `apply_rope_and_store` and the plain layers on the same inputs, as
    (rotated q, key cache, value cache) each; caches start as NaN, so stray writes show."""
    rope = RotaryEmbedding(d, 1024, 1e6, None, torch.device(device))
    q, k, v = _qkv(tokens, hq, hkv, d, dtype, device)
    pos = torch.randint(0, 1024, (tokens,), device=device)
    loc = torch.randperm(3 * tokens, device=device)[:tokens]
    norm = (torch.randn(d, dtype=dtype, device=device), torch.randn(d, dtype=dtype, device=device), 1e-6) if qk_norm else None
    caches = [torch.full((3 * tokens, hkv, d), float("nan"), dtype=dtype, device=device) for _ in range(4)]
    got = K.apply_rope_and_store(pos, q, k, v, rope.cos, rope.sin, caches[0], caches[1], loc, norm)
    want = _plain_rope_and_store(pos, q, k, v, rope, caches[2], caches[3], loc, norm)
    return [(got, *caches[:2]), (want, *caches[2:])]


@gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("qk_norm", [False, True])
def test_rope_and_store_kernel_is_rope_then_store(dtype, qk_norm):
    (q, kc, vc), (want_q, want_kc, want_vc) = _rope_store_case(dtype, "cuda", 37, 16, 8, 128, qk_norm)
    _close(q, want_q, dtype)
    written = ~torch.isnan(want_kc[:, 0, 0])
    assert torch.equal(~torch.isnan(kc[:, 0, 0]), written) and torch.equal(vc.nan_to_num(7.0), want_vc.nan_to_num(7.0))
    _close(kc[written], want_kc[written], dtype)


_INTERPRETED = """
import torch, sys
sys.path.insert(0, {tests!r})
from test_ch19_kernels import _rope_store_case
torch.manual_seed(0)
for norm in (False, True):
    (q, kc, vc), (wq, wkc, wvc) = _rope_store_case(torch.float32, "cpu", qk_norm=norm)
    torch.testing.assert_close(q, wq, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(kc.nan_to_num(7.0), wkc.nan_to_num(7.0), atol=1e-5, rtol=1e-5)
    assert torch.equal(vc.nan_to_num(7.0), wvc.nan_to_num(7.0))
print("ok")
"""


def test_rope_and_store_kernel_under_the_triton_interpreter():
    """The fused kernel itself, run by Triton's interpreter on the CPU (float32: the interpreter
    mishandles bfloat16), against the plain layers."""
    _interpret(_INTERPRETED)


# ---- the matrix-vector kernel for few rows ------------------------------------------------------
def _gemv_case(rows, n, k, dtype, device, bias=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, k, generator=g).to(dtype).to(device)
    w = (torch.randn(n, k, generator=g) / k**0.5).to(dtype).to(device)
    b = torch.randn(n, generator=g).to(dtype).to(device) if bias else None
    return x, w, b


# (features N, width K, bias) of the projections, and the N of the gate/up projection (K = 512).
# On a GPU, model-like widths. Under the interpreter, which runs each program in Python, fewer
# programs reach every masked edge the wide ones do: an odd N (the last program's second feature
# masked, with and without the activation), K = 1000 (the last of its 1, 2 or 4 loads cut short),
# K = 3072 (several full loads), N a multiple of the block (nothing masked), with and without a bias.
_GEMV_WIDE = ((1001, 1000, True), (64, 3072, False), (6, 64, True)), 300
_GEMV_NARROW = ((9, 1000, True), (8, 3072, False), (6, 64, True)), 7


def _gemv_checks(dtype, device, tol, shapes=_GEMV_WIDE):
    """The kernel against F.linear in float32 (and against silu_and_mul of it), for 1-4 rows
    (the engine sends it up to GEMV_MAX_ROWS; 3 rows leave a masked row of the 4 the kernel
    pads to), widths that are not multiples of its blocks, with and without a bias."""
    projections, gate_up_n = shapes
    for rows in range(1, 5):
        for n, k, bias in projections:
            x, w, b = _gemv_case(rows, n, k, dtype, device, bias, seed=rows * n)
            want = F.linear(x.float(), w.float(), None if b is None else b.float())
            torch.testing.assert_close(K.gemv(x, w, b).float(), want, atol=tol, rtol=tol)
        x, w, _ = _gemv_case(rows, 2 * gate_up_n, 512, dtype, device, seed=rows)
        want = silu_and_mul(F.linear(x.float(), w.float()).to(dtype))
        torch.testing.assert_close(K.gemv(x, w, silu_mul=True), want, atol=tol, rtol=tol)


_GEMV_INTERPRETED = """
import torch, sys
sys.path.insert(0, {tests!r})
from test_ch19_kernels import _GEMV_NARROW, _gemv_checks
_gemv_checks(torch.float32, "cpu", 1e-4, _GEMV_NARROW)
print("ok")
"""


def _interpret(code: str) -> None:
    """Run `code` in a fresh Python with Triton's interpreter on (it must be on before Triton loads)."""
    pytest.importorskip("triton")
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = {**os.environ, "TRITON_INTERPRET": "1"}
    env.pop("MINISGL_DISABLE_KERNELS", None)
    run = subprocess.run([sys.executable, "-c", code.format(tests=str(Path(__file__).parent))], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stderr[-2000:]


def test_gemv_kernel_under_the_triton_interpreter():
    _interpret(_GEMV_INTERPRETED)


def test_linear_takes_the_kernel_only_for_few_rows_of_16_bit_activations_on_a_gpu():
    cpu = torch.device("cpu")
    w = torch.randn(8, 16, dtype=torch.bfloat16)
    assert not K.gemv_applies(torch.randn(1, 16, dtype=torch.bfloat16), w)  # the CPU runs F.linear
    x = torch.randn(3, 16, dtype=torch.bfloat16, device=cpu)
    assert torch.equal(K.linear(x, w), F.linear(x, w))
    gate_up = torch.randn(16, 16, dtype=torch.bfloat16)
    assert torch.equal(K.linear_silu_and_mul(x, gate_up), silu_and_mul(F.linear(x, gate_up)))


@gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gemv_kernel(dtype):
    _gemv_checks(dtype, "cuda", 2e-2)


@gpu
def test_linear_uses_the_kernel_up_to_gemv_max_rows():
    w = torch.randn(64, 128, dtype=torch.bfloat16, device="cuda")
    assert K.gemv_applies(torch.randn(K.GEMV_MAX_ROWS, 128, dtype=torch.bfloat16, device="cuda"), w)
    assert not K.gemv_applies(torch.randn(K.GEMV_MAX_ROWS + 1, 128, dtype=torch.bfloat16, device="cuda"), w)
    assert not K.gemv_applies(torch.randn(1, 128, device="cuda"), w.float())  # float32 keeps cuBLAS



# ---- the norm folded into the projection that reads it -----------------------------------------
def _fold_checks(device: str, dtype, tol: float, hidden: int = 64, layer_rows=(1, 2, 5), kernel_rows=(1, 2, 3, 4)) -> None:
    """The folded norm and its projections against the plain layers on the same weights: the norm's two
    outputs and the projection's, with and without a residual, for the one row the fold takes and for rows
    it leaves to the plain path (2, 5). A pending norm whose projection gets another tensor (a view of its
    output, or a later input after a forward that failed) is run by its own kernel. Then the kernel with the
    norm inside for 1-4 rows, which it computes though the engine folds one."""
    from minisgl.kernel.fold import FOLD_MAX_ROWS, FoldedGateUp, FoldedQKV, FoldedRMSNorm
    from minisgl.layers.linear import LinearQKVMerged

    dev = torch.device(device)
    torch.manual_seed(0)
    rand = lambda *shape: torch.randn(*shape, dtype=dtype, device=dev)  # noqa: E731
    norm = _norm((torch.rand(hidden) + 0.5).to(dtype).to(dev))
    qkv = LinearQKVMerged(hidden, 16, 4, 2, bias=True, dtype=dtype, device=dev)
    gate_up = LinearColParallelMerged(hidden, [48, 48], dtype=dtype, device=dev)
    for proj in (qkv, gate_up):
        proj.weight.copy_(torch.randn(proj.weight.shape) / hidden**0.5)
    qkv.bias.copy_(torch.randn(qkv.bias.shape))
    pairs = []
    for plain, cls, run in ((qkv, FoldedQKV, "forward"), (gate_up, FoldedGateUp, "forward_silu_and_mul"),
                            (gate_up, FoldedGateUp, "forward")):
        folded_norm, folded = _norm(norm.weight), cls.__new__(cls)
        vars(folded).update(vars(plain))  # the same weights
        folded_norm.__class__, folded_norm._into = FoldedRMSNorm, folded
        pairs.append((folded_norm, getattr(folded, run), getattr(plain, run)))
    for rows in layer_rows:
        for with_residual in (False, True):
            x, r = rand(rows, hidden), rand(rows, hidden) if with_residual else None
            want_h, want_s = norm.forward_residual(x, r)
            for folded_norm, project, plain_project in pairs:
                for same_tensor in (True, False) if rows <= FOLD_MAX_ROWS else (True,):
                    h, s = folded_norm.forward_residual(x, r)
                    assert (project.__self__._pending is not None) == (rows <= FOLD_MAX_ROWS)  # left to its kernel
                    _close(project(h if same_tensor else h.view(rows, hidden)), plain_project(want_h), dtype, tol)
                    _close(h, want_h, dtype, tol)
                    assert torch.equal(s, want_s)  # the sum is rounded once, as the layer rounds it
    folded_norm, project, plain_project = pairs[0]
    x, r = rand(1, hidden), rand(1, hidden)
    h, s = folded_norm.forward_residual(x, r)  # its projection never gets h
    other = rand(1, hidden)
    _close(project(other), plain_project(other), dtype, tol)
    want_h, want_s = norm.forward_residual(x, r)
    _close(h, want_h, dtype, tol)
    assert torch.equal(s, want_s)
    for rows in kernel_rows:
        x, r = rand(rows, hidden), rand(rows, hidden)
        want_h, want_s = norm.forward_residual(x, r)
        for silu_mul, plain_project in ((False, qkv.forward), (True, gate_up.forward_silu_and_mul)):
            pending = K.PendingNorm(x, r, norm.weight, norm.eps, torch.empty_like(x), torch.empty_like(x))
            weight = gate_up.weight if silu_mul else qkv.weight
            y = K.gemv(pending.out, weight, None if silu_mul else qkv.bias, silu_mul=silu_mul, norm=pending)
            _close(y, plain_project(want_h), dtype, tol)
            _close(pending.out, want_h, dtype, tol)
            assert torch.equal(pending.summed, want_s)


_FOLD_INTERPRETED = """
import torch, sys
sys.path.insert(0, {tests!r})
import importlib
importlib.import_module("minisgl.kernel.gemv")._DTYPES = (torch.float32,)  # the engine folds 16-bit rows only
from test_ch19_kernels import _fold_checks
_fold_checks("cpu", torch.float32, 1e-5)
_fold_checks("cpu", torch.float32, 1e-5, hidden=1000, layer_rows=(1,), kernel_rows=(1, 3))  # a row in several loads
print("ok")
"""


def test_folded_norm_and_projections_match_the_plain_layers_under_the_triton_interpreter():
    _interpret(_FOLD_INTERPRETED)


@gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_folded_norm_and_projections_match_the_plain_layers(dtype):
    _fold_checks("cuda", dtype, 2e-2)
    _fold_checks("cuda", dtype, 2e-2, hidden=2560)


def test_each_norm_is_paired_with_the_one_projection_that_reads_it():
    from minisgl.kernel.fold import fold_pairs
    from minisgl.models import ModelConfig, create_model
    from minisgl.models.llama import MLP, DecoderLayer

    def ids(pairs):
        pairs = list(pairs)
        return sorted((id(norm), id(proj)) for norm, proj in pairs), len(pairs)

    dense = _tiny_qwen3("cpu", torch.float32)
    want = []
    for layer in dense.model.layers:
        want += [(layer.input_layernorm, layer.self_attn.qkv_proj), (layer.post_attention_layernorm, layer.mlp.gate_up_proj)]
    assert ids(fold_pairs(dense)) == ids(want)  # the final norm feeds the LM head, which keeps cuBLAS

    class Layer(DecoderLayer):  # a subclass may read its norms' outputs elsewhere: not folded
        pass

    dense.model.layers[0].__class__ = Layer
    assert ids(fold_pairs(dense)) == ids(want[2:])
    path = Path(__file__).resolve().parent.parent / "models" / "tiny-qwen3-moe"
    moe = create_model(ModelConfig.from_dir(path), torch.float32, torch.device("cpu"))
    layers = list(moe.model.layers)
    assert not any(type(layer.mlp) is MLP for layer in layers)  # every layer of this model is sparse
    # a mixture of experts reads the post-attention norm's output with its router and its experts
    assert ids(fold_pairs(moe)) == ids((layer.input_layernorm, layer.self_attn.qkv_proj) for layer in layers)


# ---- decode attention for a few requests -------------------------------------------------------
def _torch_decode(q, k_cache, v_cache, page_table, rows, kv_lens) -> torch.Tensor:
    """What the torch attention backend's decode computes when request i (query `q[i]`) attends to the
    slots `page_table[rows[i], :kv_lens[i]]` of the caches: the decode kernel's oracle."""
    slots, hkv, d = k_cache.shape
    pool = MHAKVCache(1, slots, 1, hkv, d, k_cache.dtype, k_cache.device)
    pool.k_cache(0).copy_(k_cache)
    pool.v_cache(0).copy_(v_cache)
    lens = kv_lens.tolist()
    mask = torch.arange(max(lens), device=q.device)[None, :] < kv_lens[:, None]
    kv_slots = page_table[rows.long(), : max(lens)].masked_fill(~mask, 0).long()
    meta = TorchAttnMetadata(list(range(len(lens))), [n - 1 for n in lens], lens, kv_slots, mask)
    return TorchAttnBackend(pool, page_table)._decode(q, 0, meta)


def _decode_case(dtype, device, hq=16, hkv=8, d=128, lens=(1, 2, 31, 33, 300, 1025), page_size=1, seed=0):
    """Requests on rows 0.. of a page table, each with whole pages of random slots, and the
    torch backend's output over them."""
    g = torch.Generator().manual_seed(seed)
    pages = sum(-(-n // page_size) for n in lens) + 4
    kc = torch.randn(pages * page_size, hkv, d, generator=g).to(dtype).to(device)
    vc = torch.randn(pages * page_size, hkv, d, generator=g).to(dtype).to(device)
    table = torch.zeros(len(lens) + 1, max(lens), dtype=torch.int32)
    free = torch.randperm(pages, generator=g).tolist()
    for row, n in enumerate(lens):
        ps = torch.tensor([free.pop() for _ in range(-(-n // page_size))])
        table[row, :n] = (ps[:, None] * page_size + torch.arange(page_size)).flatten()[:n].to(torch.int32)
    table = table.to(device)
    rows = torch.arange(len(lens), dtype=torch.int32, device=device).flip(0).contiguous()  # any row order
    kv_lens = torch.tensor(lens[::-1], dtype=torch.int32, device=device)
    q = torch.randn(len(lens), hq, d, generator=g).to(dtype).to(device)
    return (q, kc, vc, table, rows, kv_lens), _torch_decode(q, kc, vc, table, rows, kv_lens)


def test_the_decode_oracle_is_softmax_attention_over_the_request_slots():
    (q, kc, vc, table, rows, lens), want = _decode_case(torch.float32, "cpu", hq=4, hkv=2, d=16, lens=(5, 9))
    for i in range(2):
        slots = table[rows[i], : lens[i]].long()
        k = kc[slots].repeat_interleave(2, dim=1).transpose(0, 1)  # [heads, n, d]
        v = vc[slots].repeat_interleave(2, dim=1).transpose(0, 1)
        naive = F.scaled_dot_product_attention(q[i][:, None], k, v)[:, 0]
        torch.testing.assert_close(want[i], naive, atol=1e-5, rtol=1e-5)


def _decode_checks(dtype, device, tol, sms, splits_to_try=(1, 4, 64), **case):
    """The kernel against the torch backend at every split count the engine can pick, twice in a row
    (the counters must be back at zero), for page sizes 1 and 16."""
    for page_size in (1, 16):
        args, want = _decode_case(dtype, device, page_size=page_size, **case)
        bs, hkv = args[0].shape[0], args[1].shape[1]
        # room for the most splits there are (a machine with very many SMs)
        scratch = K.DecodeScratch.for_batches(bs, hkv, args[0].shape[1] // hkv, args[0].shape[2], 1 << 20, args[0].device)
        for splits in sorted({*splits_to_try, K.decode_splits(bs, hkv, sms), K.decode_splits(1, hkv, sms)}):
            for _ in range(2):
                got = K.decode_attention(*args, scratch, splits)
                torch.testing.assert_close(got.float(), want.float(), atol=tol, rtol=tol)
            assert int(scratch.count.abs().sum()) == 0
        # the large-batch tile; one split a request (as the backend picks from `one_split_min_bs`), and two
        for splits in (1, 2):
            for _ in range(2):
                got = K.decode_attention(*args, scratch, splits, tile=LARGE_TILE)
                torch.testing.assert_close(got.float(), want.float(), atol=tol, rtol=tol)
        assert int(scratch.count.abs().sum()) == 0
        # the grid's order only changes which programs run side by side: the same bits either way
        for splits in (1, 4):
            by_order = [K.decode_attention(*args, scratch, splits, heads_first=hf) for hf in (True, False)]
            assert torch.equal(by_order[0], by_order[1])
        assert int(scratch.count.abs().sum()) == 0
        # entries listed in another order than the requests (the engine lists the longest first; the case's
        # requests already are, so here the shortest): each entry's query and output found through `order`,
        # and again the same bits as in request order
        q, kc, vc, table, rows, kv_lens = args
        order = torch.argsort(kv_lens, stable=True).to(torch.int32)
        assert not torch.equal(order.cpu(), torch.arange(bs, dtype=torch.int32))  # a real permutation
        for splits, tile in ((1, SMALL_TILE), (4, SMALL_TILE), (1, LARGE_TILE), (2, LARGE_TILE)):
            plain = K.decode_attention(*args, scratch, splits, tile=tile)
            listed = K.decode_attention(q, kc, vc, table, rows[order.long()], kv_lens[order.long()], scratch, splits, tile=tile, order=order)
            assert torch.equal(listed, plain)
        assert int(scratch.count.abs().sum()) == 0


_DECODE_INTERPRETED = """
import torch, sys
sys.path.insert(0, {tests!r})
from test_ch19_kernels import _decode_checks
_decode_checks(torch.float32, "cpu", 1e-4, sms=8, splits_to_try=(1, 8), hq=4, hkv=2, d=16, lens=(1, 2, 33, 70))  # small: the interpreter is slow
print("ok")
"""


def test_decode_attention_kernel_under_the_triton_interpreter():
    _interpret(_DECODE_INTERPRETED)


@gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_decode_attention_kernel(dtype):
    _decode_checks(dtype, "cuda", 2e-2, torch.cuda.get_device_properties(0).multi_processor_count)


def _decode_rope_checks(dtype, device, tol, sms, hq=16, hkv=8, d=128, lens=(1, 2, 31, 33, 300, 1025)):
    """The kernel that rotates as it attends, handed q, k and v as views of one projection output:
    its output and the caches it leaves against the plain layers' norms and RoPE, the store, then the torch
    backend's attention, with and without qk-norm, at the engine's split counts and both tiles."""
    torch.manual_seed(1)
    for page_size, qk_norm in ((1, True), (16, False)):
        (q0, kc0, vc0, table, rows, kv_lens), _ = _decode_case(dtype, device, hq, hkv, d, lens, page_size)
        bs = len(lens)
        q, k, v = _qkv(bs, hq, hkv, d, dtype, device)
        out_loc = table[rows.long(), kv_lens.long() - 1].long()  # each request's new key: its last position
        positions = (kv_lens - 1).long() + torch.randint(0, 7, (bs,), device=device)  # need not match the length
        rope = RotaryEmbedding(d, 2048, 1e6, None, torch.device(device))
        norm = (torch.randn(d, dtype=dtype, device=device), torch.randn(d, dtype=dtype, device=device), 1e-6) if qk_norm else None
        pending = K.PendingRope(positions, k, v, out_loc, rope.cos, rope.sin, norm)
        kc, vc = kc0.clone(), vc0.clone()
        want_q = _plain_rope_and_store(positions, q, k, v, rope, kc, vc, out_loc, norm)
        want = _torch_decode(want_q, kc, vc, table, rows, kv_lens)
        scratch = K.DecodeScratch.for_batches(bs, hkv, hq // hkv, d, 1 << 20, q.device)
        tiles = [(s, SMALL_TILE) for s in sorted({1, 4, K.decode_splits(bs, hkv, sms)})] + [(1, LARGE_TILE), (2, LARGE_TILE)]
        for splits, tile in tiles:
            got_kc, got_vc = kc0.clone(), vc0.clone()
            got = K.decode_attention(q, got_kc, got_vc, table, rows, kv_lens, scratch, splits, tile=tile, rope=pending)
            torch.testing.assert_close(got.float(), want.float(), atol=tol, rtol=tol)
            torch.testing.assert_close(got_kc.float(), kc.float(), atol=tol, rtol=tol)  # only the new keys moved
            assert torch.equal(got_vc, vc)
            assert int(scratch.count.abs().sum()) == 0
            # entries in another order (shortest first): each rotates and stores its own request's key, and
            # writes its output row
            order = torch.argsort(kv_lens, stable=True).to(torch.int32)
            got_kc, got_vc = kc0.clone(), vc0.clone()
            listed = K.decode_attention(q, got_kc, got_vc, table, rows[order.long()], kv_lens[order.long()], scratch, splits, tile=tile,
                                        rope=pending, order=order)
            torch.testing.assert_close(listed.float(), want.float(), atol=tol, rtol=tol)
            torch.testing.assert_close(got_kc.float(), kc.float(), atol=tol, rtol=tol)
            assert torch.equal(got_vc, vc)


_DECODE_ROPE_INTERPRETED = """
import torch, sys
sys.path.insert(0, {tests!r})
from test_ch19_kernels import _decode_rope_checks
_decode_rope_checks(torch.float32, "cpu", 1e-4, sms=8, hq=4, hkv=2, d=16, lens=(1, 2, 33, 70))
print("ok")
"""


def test_decode_attention_with_rope_under_the_triton_interpreter():
    _interpret(_DECODE_ROPE_INTERPRETED)


@gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_decode_attention_with_rope_kernel(dtype):
    _decode_rope_checks(dtype, "cuda", 2e-2, torch.cuda.get_device_properties(0).multi_processor_count)


def test_cpu_projections_agree_with_f_linear_and_follow_edits_of_the_weight(monkeypatch):
    """float32 on the CPU goes through oneDNN with the weight reordered once: the same products
    summed in another order, and a weight edited in place is reordered again, never stale."""
    cpu_gemm = importlib.import_module("minisgl.kernel.cpu_gemm")
    torch.manual_seed(0)
    x, w = torch.randn(32, 576), torch.randn(1536, 576)
    torch.testing.assert_close(K.cpu_linear(x, w), F.linear(x, w), rtol=1e-5, atol=2e-4)
    w.mul_(2)  # as a checkpoint load would, in place
    torch.testing.assert_close(K.cpu_linear(x, w), F.linear(x, w), rtol=1e-5, atol=4e-4)
    x3 = x.view(4, 8, 576)  # any leading shape
    torch.testing.assert_close(K.cpu_linear(x3, w), F.linear(x3, w), rtol=1e-5, atol=4e-4)
    with torch.inference_mode():
        w_inf = torch.randn(64, 576)  # keeps no version counter: F.linear, bit for bit
    assert torch.equal(K.cpu_linear(x, w_inf), F.linear(x, w_inf))
    monkeypatch.setattr(cpu_gemm, "CPU_GEMM_ENV", dataclasses.replace(cpu_gemm.CPU_GEMM_ENV, disable_onednn=True))
    assert torch.equal(K.cpu_linear(x, w), F.linear(x, w))  # MINISGL_DISABLE_ONEDNN=1


# ---- the kernel-backed layers and the pass that swaps them in -------------------------------------
def _tiny_qwen3(device: str, dtype: torch.dtype):
    """The bundled tiny Qwen3 (qk-norm, two layers) with random weights, as the engine builds it."""
    from pathlib import Path

    from minisgl.models import ModelConfig, create_model, load_dummy

    cfg = ModelConfig.from_dir(Path(__file__).resolve().parent.parent / "models" / "tiny-qwen3")
    model = create_model(cfg, dtype, torch.device(device))
    load_dummy(model, 0)
    return model


def _kernel_layer_checks(device: str, dtype, tol: float, rows=(1, 5)) -> None:
    """Each kernel-backed layer against the plain layer it subclasses, on the same weights, for a decode
    step's rows and a prefill's."""
    from minisgl.kernel.layers import KernelLinearColParallelMerged, KernelLinearRowParallel, KernelRMSNorm, KernelRotaryEmbedding

    dev = torch.device(device)
    torch.manual_seed(0)
    norm = _norm(torch.randn(64, dtype=dtype, device=dev))
    fast_norm = KernelRMSNorm(64, 1e-6, dtype=dtype, device=dev)
    fast_norm.weight.copy_(norm.weight)
    rope, fast_rope = (cls(32, 256, 1e6, None, dev) for cls in (RotaryEmbedding, KernelRotaryEmbedding))
    # the same tables built twice: MKL's first-call race (rotary._cos_sin) once left the first one's cosines 1.5e-4 off
    assert torch.equal(rope.cos, fast_rope.cos) and torch.equal(rope.sin, fast_rope.sin)
    gate_up, fast_gate_up = (cls(64, [48, 48], dtype=dtype, device=dev) for cls in (LinearColParallelMerged, KernelLinearColParallelMerged))
    down, fast_down = (cls(48, 64, dtype=dtype, device=dev) for cls in (LinearRowParallel, KernelLinearRowParallel))
    gate_up.weight.copy_(torch.randn(96, 64) / 8)
    fast_gate_up.weight.copy_(gate_up.weight)
    down.weight.copy_(torch.randn(64, 48) / 7)
    fast_down.weight.copy_(down.weight)
    for n in rows:
        x, r = torch.randn(n, 64, dtype=dtype, device=dev), torch.randn(n, 64, dtype=dtype, device=dev)
        _close(fast_norm(x), norm(x), dtype, tol)
        for got, want in zip(fast_norm.forward_residual(x, r), norm.forward_residual(x, r)):
            _close(got, want, dtype, tol)
        q, k, _ = _qkv(n, 4, 2, 32, dtype, dev)
        pos = torch.randint(0, 256, (n,), device=dev)
        for got, want in zip(fast_rope(pos, q, k), rope(pos, q, k)):
            _close(got, want, dtype, tol)
        _close(fast_gate_up.forward_silu_and_mul(x), gate_up.forward_silu_and_mul(x), dtype, tol)
        h = torch.randn(n, 48, dtype=dtype, device=dev)
        _close(fast_down(h), down(h), dtype, tol)


_LAYERS_INTERPRETED = """
import torch, sys
sys.path.insert(0, {tests!r})
from test_ch19_kernels import _kernel_layer_checks
_kernel_layer_checks("cpu", torch.float32, 1e-5)
print("ok")
"""


def test_kernel_layers_match_the_plain_layers_under_the_triton_interpreter():
    """The norm, RoPE and activation kernels behind the kernel-backed layers, run by Triton's interpreter
    on float32 CPU tensors, against the layers' plain forward."""
    _interpret(_LAYERS_INTERPRETED)


@gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_kernel_layers_match_the_plain_layers(dtype):
    _kernel_layer_checks("cuda", dtype, 2e-2 if dtype == torch.bfloat16 else 1e-5)


def test_the_pass_on_the_cpu_packs_the_projections_and_keeps_their_products():
    from minisgl.kernel import cpu_gemm
    from minisgl.kernel.swap import layers_of

    model = _tiny_qwen3("cpu", torch.float32)
    if not cpu_gemm.ONEDNN or cpu_gemm.CPU_GEMM_ENV.disable_onednn:
        pytest.skip("oneDNN is not in this build of torch (or MINISGL_DISABLE_ONEDNN=1)")
    mlp = model.model.layers[0].mlp
    plain_w = mlp.gate_up_proj.weight.clone()
    x = torch.randn(3, plain_w.shape[1])
    want = mlp(x)
    before = {id(op): type(op).__name__ for op in layers_of(model)}
    swapped = K.swap_in_kernels(model)
    projections = ("LinearQKVMerged", "LinearColParallelMerged", "LinearRowParallel", "ParallelLMHead")
    assert set(swapped) == set(projections)  # norms and RoPE stay plain on the CPU
    assert sum(swapped.values()) == sum(name in projections for name in before.values())
    assert mlp.gate_up_proj.weight.is_mkldnn and torch.equal(cpu_gemm.plain(mlp.gate_up_proj.weight), plain_w)
    torch.testing.assert_close(mlp(x), want, rtol=1e-5, atol=1e-5)  # the same products, summed in another order
    assert K.swap_in_kernels(model) == {}  # a second run changes nothing



class _Watched(torch.Tensor):
    """A norm's output that records every torch function it goes into (`_Watched.uses`)."""

    uses: list = []

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", str(func))
        cls.uses.append(func.__self__.__name__ if name == "__get__" else name)  # a property: its own name
        return super().__torch_function__(func, types, args, kwargs or {})


_SHAPE_ONLY = {"__len__", "size", "dim", "shape", "dtype", "device"}  # they read no values


def test_a_folded_norms_output_goes_to_its_projection_and_nowhere_else(monkeypatch):
    """What `fold_pairs` declares, traced through the real forward of DecoderLayer, Attention and MLP: each
    norm's output reaches its projection as the very tensor the norm returned, and no torch function reads it
    on the way (the folded norm's output is unwritten until that projection's launch)."""
    from minisgl import core

    layer = _tiny_qwen3("cpu", torch.float32).model.layers[0]
    x, res = torch.randn(1, 64), torch.randn(1, 64)
    outs = [torch.Tensor._make_subclass(_Watched, torch.randn(1, 64)) for _ in range(2)]
    handed = []
    attn, mlp = layer.self_attn, layer.mlp
    monkeypatch.setattr(layer.input_layernorm, "forward_residual", lambda x, r: (outs[0], x))
    monkeypatch.setattr(layer.post_attention_layernorm, "forward_residual", lambda h, r: (outs[1], h))
    monkeypatch.setattr(attn.qkv_proj, "forward",
                        lambda h: (handed.append(h), torch.zeros(len(x), attn.qkv_proj.weight.shape[0]))[1])
    monkeypatch.setattr(mlp.gate_up_proj, "forward_silu_and_mul",
                        lambda h: (handed.append(h), torch.zeros(len(x), mlp.gate_up_proj.local_sizes[0]))[1])

    class Backend:  # attention's output, without attending
        def forward(self, q, k, v, layer_id, batch, qk):
            return torch.zeros_like(q)

    monkeypatch.setattr(core, "_GLOBAL_CTX", core.Context(page_size=1, attn_backend=Backend()))
    _Watched.uses = []
    layer.forward(x, res)
    assert len(handed) == 2 and handed[0] is outs[0] and handed[1] is outs[1]
    assert set(_Watched.uses) <= _SHAPE_ONLY, _Watched.uses

@gpu
def test_the_pass_on_a_gpu_swaps_every_layer_a_kernel_serves_and_the_switch_keeps_them_plain(monkeypatch):
    from minisgl.kernel import util

    monkeypatch.setattr(util, "KERNEL_ENV", dataclasses.replace(util.KERNEL_ENV, disable_kernels=True))
    assert K.swap_in_kernels(_tiny_qwen3("cuda", torch.bfloat16)) == {}  # MINISGL_DISABLE_KERNELS=1
    monkeypatch.undo()
    model = _tiny_qwen3("cuda", torch.bfloat16)
    swapped = K.swap_in_kernels(model)
    assert swapped == {"RMSNorm": 2 * 4 + 1, "RotaryEmbedding": 1, "LinearQKVMerged": 2, "LinearColParallelMerged": 2,
                       "LinearRowParallel": 4}  # the LM head keeps cuBLAS
    from minisgl.kernel.fold import fold_norms

    assert fold_norms(model) == 2 * 2 and fold_norms(model) == 0  # two norms a layer, once


@gpu
def test_engine_logits_with_the_kernels_match_the_plain_layers(tmp_path, monkeypatch):
    """Through the torch attention backend, so only the layers differ: the plain model against the one
    the pass gave kernels."""
    from minisgl.kernel import util
    from test_ch17_flashinfer import _first_logits, rel_err, small_qwen3

    model = small_qwen3(tmp_path)
    rng = random.Random(0)
    prompts = [[rng.randint(0, 2000) for _ in range(n)] for n in (1, 2, 40)]
    got = _first_logits(model, "torch", prompts, 16)
    monkeypatch.setattr(util, "KERNEL_ENV", dataclasses.replace(util.KERNEL_ENV, disable_kernels=True))
    want = _first_logits(model, "torch", prompts, 16)
    assert rel_err(got, want) < 3e-2 and torch.equal(got.argmax(-1), want.argmax(-1))



def _decode_logits(model: str, prompts) -> torch.Tensor:
    """The logits of the prefill step and of the first decode step, in bfloat16, decode replayed from a graph."""
    from minisgl.core import SamplingParams
    from minisgl.llm import LLM

    llm = LLM(model, dummy_weights=True, dtype="bfloat16", max_running_reqs=4, num_pages=4096)
    seen = []
    sample = llm.engine.sampler.sample
    llm.engine.sampler.sample = lambda logits, args: (seen.append(logits.float().clone()), sample(logits, args))[1]
    llm.generate(prompts, SamplingParams(max_tokens=2, ignore_eos=True))
    llm.shutdown()
    return torch.cat(seen)


@gpu
@pytest.mark.parametrize("requests", [1, 2])
def test_a_decode_step_with_the_norms_folded_matches_one_without(tmp_path, monkeypatch, requests):
    """One request decodes through the folded kernel, two through the plain ones (the prefill, 40 rows a
    request, through neither): the same tokens and logits as the engine whose pass folds nothing."""
    from minisgl.kernel import fold
    from test_ch17_flashinfer import rel_err, small_qwen3

    model = small_qwen3(tmp_path)
    prompts = [[random.Random(i).randint(0, 2000) for _ in range(40)] for i in range(requests)]
    folded = []  # the rows of each launch with a norm inside (graph capture runs the Python)
    gemv = fold.gemv
    monkeypatch.setattr(fold, "gemv", lambda x, *a, norm=None, **kw: (folded.append(len(x)), gemv(x, *a, norm=norm, **kw))[1])
    got = _decode_logits(model, prompts)
    assert folded and set(folded) == {1}  # one row folds, and only one
    monkeypatch.setattr(fold, "fold_norms", lambda model: 0)  # what the engine's fold pass calls
    want = _decode_logits(model, prompts)
    assert got.shape == want.shape == (2 * requests, 2048)
    assert torch.equal(got[:requests], want[:requests])  # the prefill: the same kernels
    assert rel_err(got, want) < 3e-2 and torch.equal(got.argmax(-1), want.argmax(-1))


# ---- the triton-decode backend against the torch backend (GPU) ----------------------------------
def triton_decode(thresholds: DecodeThresholds = THRESHOLDS):
    """A maker for `against_torch`: the backend of this chapter, with the given thresholds table."""

    def make(kv, table):
        return tdb.TritonDecodeAttnBackend(kv, table, num_qo_heads=HQ, thresholds=thresholds)

    return make


_T = THRESHOLDS
# a decode batch size in each regime the thresholds table names (and at each edge between them)
REGIMES = {
    "one request, small tile, rope in kernel": 1,
    "small tile, rope in kernel": _T.small_tile_max_bs,
    "large tile, splits, longest first, rope in kernel": _T.small_tile_max_bs + 1,
    "large tile, one split, longest first, rope in kernel": _T.one_split_min_bs,
    "large tile, one split, longest first, rope in kernel, its last size": _T.rope_in_kernel_max_bs,
    "large tile, one split, longest first, rope launched first": _T.rope_in_kernel_max_bs + 1,
    "large tile, one split, as they come, rope launched first": _T.longest_first_max_bs + 1,
}


def test_the_regimes_are_ordered_as_the_table_says():
    """The sizes above land in the regimes their names say only if the table keeps this order."""
    assert 0 < _T.small_tile_max_bs < _T.one_split_min_bs <= _T.rope_in_kernel_max_bs < _T.longest_first_max_bs
    assert _T.min_splits >= 2 and _T.max_head_dim == 128


def _count_rope_launches(monkeypatch) -> dict:
    """Count the separate RoPE-and-store launches of the backend, and its falls back to the plain sequence."""
    calls = {"backend": 0, "plain": 0}
    for owner, name, key in ((tdb, "apply_rope_and_store", "backend"), (tdb.FlashInferAttnBackend, "forward", "plain")):
        real = getattr(owner, name)

        def counted(*args, _real=real, _key=key, **kwargs):
            calls[_key] += 1
            return _real(*args, **kwargs)

        monkeypatch.setattr(owner, name, counted)
    return calls


def _check_triton_decode(monkeypatch, bs: int, page_size: int, thresholds: DecodeThresholds = THRESHOLDS, qk_norm: bool = True):
    """One decode batch through the backend's `forward` against the torch backend, and the path the
    thresholds table says the batch takes: tile, splits, entry order, where RoPE runs."""
    t = thresholds
    calls = _count_rope_launches(monkeypatch)
    specs = decode_specs(bs)
    want, got, meta = against_torch(triton_decode(t), specs, "decode", page_size, qk_norm=qk_norm)
    assert_matches_torch(want, got)
    assert isinstance(meta, tdb.TritonDecodeMetadata) and meta.size == bs
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    small = bs <= t.small_tile_max_bs
    assert meta.tile == (SMALL_TILE if small else LARGE_TILE)
    if small:
        assert meta.splits == K.decode_splits(bs, HKV, sms)
    elif bs >= t.one_split_min_bs:
        assert meta.splits == 1  # each program writes its request's output: no partials to merge
    else:
        assert meta.splits == max(t.min_splits, K.decode_splits(bs, HKV, sms, t.programs_per_sm)) >= 2
    lens, entries = [n for _, n in specs], meta.kv_lens.tolist()
    if t.small_tile_max_bs < bs <= t.longest_first_max_bs:  # longest first, each found again through `order`
        order = meta.order.tolist()
        assert sorted(order) == list(range(bs)) and entries == sorted(lens, reverse=True)
        assert [lens[i] for i in order] == entries and meta.rows.tolist() == order  # request r sits on row r
    else:
        assert meta.order is None and entries == lens
    layers = got[0].shape[0]
    # rope inside the decode kernel (no separate launch), or one fused RoPE-and-store launch a layer first
    assert calls == {"backend": 0 if bs <= t.rope_in_kernel_max_bs else layers, "plain": 0}


@gpu
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("bs", list(REGIMES.values()), ids=list(REGIMES))
def test_triton_decode_backend_matches_torch_backend_in_every_regime(monkeypatch, page_size, bs):
    _check_triton_decode(monkeypatch, bs, page_size)


@gpu
@pytest.mark.parametrize("bs", [_T.small_tile_max_bs, _T.rope_in_kernel_max_bs + 1])
def test_triton_decode_backend_without_qk_norm(monkeypatch, bs):
    """A model without Qwen3's per-head norms (Llama): RoPE alone, in the kernel and before it."""
    _check_triton_decode(monkeypatch, bs, 16, qk_norm=False)


@gpu
def test_the_thresholds_table_decides_the_decode_path(monkeypatch):
    """Another table, another path, the same result: every batch at the large tile, one split, in
    request order, RoPE launched first."""
    plain = DecodeThresholds(small_tile_max_bs=0, rope_in_kernel_max_bs=0, longest_first_max_bs=0, one_split_min_bs=1)
    _check_triton_decode(monkeypatch, 5, 16, thresholds=plain)


@gpu
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("qk_norm", [True, False])
def test_triton_decode_backend_prefills_with_flashinfer_after_the_fused_rope_and_store(monkeypatch, page_size, qk_norm):
    calls = _count_rope_launches(monkeypatch)
    want, got, meta = against_torch(triton_decode(), PREFILL_SPECS, "prefill", page_size, qk_norm=qk_norm)
    assert type(meta.wrapper).__name__ == "BatchPrefillWithPagedKVCacheWrapper"
    assert calls["backend"] == got[0].shape[0]  # one launch a layer: norms, RoPE and the KV store
    assert_matches_torch(want, got)


@gpu
@pytest.mark.parametrize("bs", [1, _T.rope_in_kernel_max_bs + 1])
def test_triton_decode_backend_leaves_head_dim_256_decode_to_flashinfer(bs):
    want, got, meta = against_torch(triton_decode(), decode_specs(bs), "decode", 16, d=256)
    assert type(meta.wrapper).__name__ == "BatchDecodeWithPagedKVCacheWrapper"
    assert_matches_torch(want, got)


@gpu
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("bs, padded", [(1, 1), (3, 4), (5, 8), (50, 56), (60, 64), (170, 176)])
def test_triton_decode_replayed_from_a_cuda_graph_matches_torch_backend(page_size, bs, padded):
    """Captured while every row is padding, replayed for a real batch padded to the captured size: the
    entries, key counts and order live in the graph's fixed buffer, re-filled before each replay."""
    want, got, meta = graph_against_torch(triton_decode(), decode_specs(bs), padded, page_size)
    assert isinstance(meta, tdb.TritonDecodeMetadata) and meta.size == padded
    assert_matches_torch(want, got)


@gpu
@pytest.mark.parametrize("n", [42, 101])  # padded to 48 (RoPE in the kernel) and to 104 (launched first)
def test_many_requests_decode_through_the_kernel_in_graphs_like_the_torch_backend(tmp_path, n):
    from test_ch17_flashinfer import assert_decode_logits_close, decode_logits, small_qwen3

    model = small_qwen3(tmp_path)
    rng = random.Random(3)
    prompts = [[rng.randint(0, 2000) for _ in range(rng.choice([1, 2, 3, 50, 400, 1200]))] for _ in range(n)]
    got = decode_logits(model, prompts, "auto")
    assert got[2] == "TritonDecodeAttnBackend"  # what "auto" builds on CUDA
    want = decode_logits(model, prompts, "torch")
    assert_decode_logits_close(got, want)
