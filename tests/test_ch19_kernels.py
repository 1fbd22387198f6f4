"""Chapter 19: fused kernels. Each PyTorch fallback is checked against a naive reference (or the
layer it replaces) on the CPU; on a GPU each Triton kernel is checked against its fallback."""

from __future__ import annotations

import dataclasses
import math
import importlib

import pytest
import torch
import torch.nn.functional as F

from minisgl import kernel as K
from minisgl.layers.norm import RMSNorm
from minisgl.layers.rotary import RotaryEmbedding

gpu = pytest.mark.gpu


def _qkv(tokens: int, hq: int, hkv: int, d: int, dtype, device):
    """q, k, v as strided views of one fused projection output, as the attention layer makes them."""
    qkv = torch.randn(tokens, (hq + 2 * hkv) * d, dtype=dtype, device=device)
    q, k, v = qkv.split([hq * d, hkv * d, hkv * d], dim=-1)
    return q.view(tokens, hq, d), k.view(tokens, hkv, d), v.view(tokens, hkv, d)


# ---- fallbacks against naive references (CPU) --------------------------------------------------
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


def test_rmsnorm_ref_matches_the_layer():
    norm = RMSNorm(32, 1e-6, dtype=torch.float32, device=torch.device("cpu"))
    norm.weight.copy_(torch.randn(32))
    x, r = torch.randn(5, 32), torch.randn(5, 32)
    assert torch.equal(K.rmsnorm(x, norm.weight, 1e-6), norm.forward(x))
    out, s = K.fused_add_rmsnorm(x, r, norm.weight, 1e-6)
    want_out, want_s = norm.forward_residual(x, r)
    assert torch.equal(out, want_out) and torch.equal(s, want_s)
    naive = x / torch.sqrt((x * x).mean(-1, keepdim=True) + 1e-6) * norm.weight
    torch.testing.assert_close(K.rmsnorm_ref(x, norm.weight, 1e-6), naive)


def test_rope_with_qk_norm_on_the_cpu_is_the_two_layers_in_turn():
    rope = RotaryEmbedding(16, 64, 10000.0, None, torch.device("cpu"))
    q, k, _ = _qkv(5, 3, 1, 16, torch.float32, "cpu")
    pos = torch.tensor([0, 1, 7, 33, 63])
    qn, kn = (RMSNorm(16, 1e-6, dtype=torch.float32, device=torch.device("cpu")) for _ in range(2))
    qn.weight.copy_(torch.randn(16))
    kn.weight.copy_(torch.randn(16))
    got = rope.forward(pos, q, k, (qn, kn))
    want = rope.forward(pos, qn.forward(q), kn.forward(k))
    assert all(torch.equal(g, w) for g, w in zip(got, want))


def test_rope_ref_rotates_each_pair_by_its_angle():
    rope = RotaryEmbedding(16, 64, 10000.0, None, torch.device("cpu"))
    q, k, _ = _qkv(5, 3, 1, 16, torch.float32, "cpu")
    pos = torch.tensor([0, 1, 7, 33, 63])
    got_q, got_k = K.apply_rope(pos, q, k, rope._cos, rope._sin)
    # the rotate-half layout pairs dimension i with i + 8 and turns the pair by pos * theta_i
    theta = 10000.0 ** (-torch.arange(0, 16, 2).float() / 16)
    ang = pos[:, None].float() * theta[None, :]
    cos, sin = ang.cos()[:, None, :], ang.sin()[:, None, :]
    a, b = q[..., :8], q[..., 8:]
    torch.testing.assert_close(got_q, torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1), atol=1e-5, rtol=1e-5)
    assert torch.equal(got_k, rope.forward(pos, q, k)[1])


def test_silu_and_mul_ref():
    x = torch.randn(3, 20)
    gate, up = x[:, :10], x[:, 10:]
    torch.testing.assert_close(K.silu_and_mul(x), gate * torch.sigmoid(gate) * up)


# ---- Triton kernels against the fallbacks (GPU) ------------------------------------------------
DTYPES = [torch.bfloat16, torch.float32]


def _close(got: torch.Tensor, want: torch.Tensor, dtype) -> None:
    assert not torch.isnan(got).any()
    tol = 1e-2 if dtype == torch.bfloat16 else 1e-5
    torch.testing.assert_close(got.float(), want.float(), atol=tol, rtol=tol)


@gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_store_kv_kernel(dtype):
    q, k, v = _qkv(37, 16, 8, 128, dtype, "cuda")
    k_cache = torch.full((1000, 8, 128), float("nan"), dtype=dtype, device="cuda")
    v_cache = k_cache.clone()
    loc = torch.randperm(1000, device="cuda")[:37]
    want_k, want_v = k_cache.clone(), v_cache.clone()
    K.store_kv_ref(k, v, want_k, want_v, loc)
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
    _close(K.rmsnorm(x, w, 1e-6), K.rmsnorm_ref(x, w, 1e-6), dtype)
    out, s = K.fused_add_rmsnorm(x, r, w, 1e-6)
    want_out, want_s = K.fused_add_rmsnorm_ref(x, r, w, 1e-6)
    assert torch.equal(s, want_s)
    _close(out, want_out, dtype)
    q, k, _ = _qkv(77, 16, 8, 128, dtype, "cuda")  # per-head norm on strided views
    wq = torch.randn(128, dtype=dtype, device="cuda")
    _close(K.rmsnorm(q, wq, 1e-6), K.rmsnorm_ref(q, wq, 1e-6), dtype)
    _close(K.rmsnorm(k, wq, 1e-6), K.rmsnorm_ref(k, wq, 1e-6), dtype)


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
    for got, want in zip(K.apply_rope(pos, q, k, rope._cos, rope._sin), K.apply_rope_ref(pos, q, k, rope._cos, rope._sin)):
        _close(got, want, dtype)


@gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_rope_kernel_with_qk_norm_is_norm_then_rope(dtype):
    """Qwen3's qk-norm folded into the rope launch computes what the two layers compute apart."""
    rope, q, k, pos = _rope_inputs(dtype)
    wq, wk = torch.randn(128, dtype=dtype, device="cuda"), torch.randn(128, dtype=dtype, device="cuda")
    got = K.apply_rope(pos, q, k, rope._cos, rope._sin, (wq, wk, 1e-6))
    want = K.apply_rope_ref(pos, K.rmsnorm_ref(q, wq, 1e-6), K.rmsnorm_ref(k, wk, 1e-6), rope._cos, rope._sin)
    for g, w in zip(got, want):
        _close(g, w, dtype)


@gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_and_mul_kernel(dtype):
    x = torch.randn(33, 2 * 3072, dtype=dtype, device="cuda")
    _close(K.silu_and_mul(x), K.silu_and_mul_ref(x), dtype)
    assert torch.equal(K.silu_and_mul(x[:0]), K.silu_and_mul_ref(x[:0]))


def _rope_store_case(dtype, device, tokens=9, hq=4, hkv=2, d=64, qk_norm=True):
    """(got, want): `apply_rope_and_store` and its reference on the same inputs, as
    (rotated q, key cache, value cache) each; caches start as NaN, so stray writes show."""
    rope = RotaryEmbedding(d, 1024, 1e6, None, torch.device(device))
    q, k, v = _qkv(tokens, hq, hkv, d, dtype, device)
    pos = torch.randint(0, 1024, (tokens,), device=device)
    loc = torch.randperm(3 * tokens, device=device)[:tokens]
    norm = (torch.randn(d, dtype=dtype, device=device), torch.randn(d, dtype=dtype, device=device), 1e-6) if qk_norm else None
    out = []
    for fn in (K.apply_rope_and_store, K.apply_rope_and_store_ref):
        kc = torch.full((3 * tokens, hkv, d), float("nan"), dtype=dtype, device=device)
        vc = kc.clone()
        out.append((fn(pos, q, k, v, rope._cos, rope._sin, kc, vc, loc, norm), kc, vc))
    return out


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
    mishandles bfloat16), against the reference."""
    _interpret(_INTERPRETED)


# ---- the matrix-vector kernel for few rows ------------------------------------------------------
def _gemv_case(rows, n, k, dtype, device, bias=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, k, generator=g).to(dtype).to(device)
    w = (torch.randn(n, k, generator=g) / k**0.5).to(dtype).to(device)
    b = torch.randn(n, generator=g).to(dtype).to(device) if bias else None
    return x, w, b


def _gemv_checks(dtype, device, tol):
    """The kernel against F.linear in float32 (and against silu_and_mul of it), for 1-4 rows
    (the engine sends it up to GEMV_MAX_ROWS), widths that are not multiples of its blocks, with
    and without a bias."""
    for rows in range(1, 5):
        for n, k, bias in ((1001, 1000, True), (64, 3072, False), (6, 64, True)):
            x, w, b = _gemv_case(rows, n, k, dtype, device, bias, seed=rows * n)
            want = F.linear(x.float(), w.float(), None if b is None else b.float())
            torch.testing.assert_close(K.gemv(x, w, b).float(), want, atol=tol, rtol=tol)
        x, w, _ = _gemv_case(rows, 2 * 300, 512, dtype, device, seed=rows)
        want = K.silu_and_mul_ref(F.linear(x.float(), w.float()).to(dtype))
        torch.testing.assert_close(K.gemv(x, w, silu_mul=True), want, atol=tol, rtol=tol)


_GEMV_INTERPRETED = """
import torch, sys
sys.path.insert(0, {tests!r})
from test_ch19_kernels import _gemv_checks
_gemv_checks(torch.float32, "cpu", 1e-4)
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
    assert torch.equal(K.linear_silu_and_mul(x, gate_up), K.silu_and_mul_ref(F.linear(x, gate_up)))


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


# ---- the projection with its RMSNorm inside ----------------------------------------------------
def _gemv_normed_checks(dtype, device, tol, shapes=((77, 1000, False), (600, 512, True), (64, 3072, False))):
    """`gemv_normed` against `fused_add_rmsnorm` then the projection: the residual stream it
    returns is bit-equal to the norm kernel's, the output equal to the dtype's rounding."""
    for rows in (1, 2):
        for n, k, silu in shapes:
            x, w, _ = _gemv_case(rows, n, k, dtype, device, seed=rows + n)
            r = torch.randn(rows, k).to(dtype).to(device)
            nw = (1 + torch.randn(k) / 4).to(dtype).to(device)
            for res in (r, None):  # no residual yet: the first layer
                got, summed = K.gemv_normed(x, K.PreNorm(nw, 1e-6, res), w, silu_mul=silu)
                h, want_summed = K.fused_add_rmsnorm(x, res, nw, 1e-6)
                want = K.linear_silu_and_mul_ref(h, w) if silu else F.linear(h.float(), w.float()).to(dtype)
                assert torch.equal(summed, want_summed)
                torch.testing.assert_close(got.float(), want.float(), atol=tol, rtol=tol)


_GEMV_NORMED_INTERPRETED = """
import torch, sys
sys.path.insert(0, {tests!r})
from test_ch19_kernels import _gemv_normed_checks
_gemv_normed_checks(torch.float32, "cpu", 1e-4, shapes=((7, 1100, False), (10, 96, True)))  # small: the interpreter is slow
print("ok")
"""


def test_gemv_normed_kernel_under_the_triton_interpreter():
    _interpret(_GEMV_NORMED_INTERPRETED)


@gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gemv_normed_kernel(dtype):
    _gemv_normed_checks(dtype, "cuda", 2e-2)


def test_projection_with_its_norm_equals_norm_then_projection_on_the_cpu():
    from minisgl.layers.linear import LinearColParallelMerged, LinearReplicated

    cpu = torch.device("cpu")
    norm = RMSNorm(64, 1e-6, dtype=torch.float32, device=cpu)
    norm.weight.copy_(torch.randn(64))
    proj = LinearReplicated(64, 32, dtype=torch.float32, device=cpu)
    gate_up = LinearColParallelMerged(64, [48, 48], dtype=torch.float32, device=cpu)
    proj.weight.copy_(torch.randn(32, 64))
    gate_up.weight.copy_(torch.randn(96, 64))
    x, r = torch.randn(3, 64), torch.randn(3, 64)
    h, s = norm.forward_residual(x, r)
    y, s2 = proj.forward_normed(x, r, norm)
    assert torch.equal(y, proj(h)) and torch.equal(s2, s)
    y, s2 = gate_up.forward_normed_silu_and_mul(x, r, norm)
    assert torch.equal(y, gate_up.forward_silu_and_mul(h)) and torch.equal(s2, s)


# ---- decode attention for a few requests -------------------------------------------------------
def _decode_case(dtype, device, hq=16, hkv=8, d=128, lens=(1, 2, 31, 33, 300, 1025), page_size=1, seed=0):
    """Requests on rows 0.. of a page table, each with whole pages of random slots, and the
    reference output over them."""
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
    return (q, kc, vc, table, rows, kv_lens), K.decode_attention_ref(q, kc, vc, table, rows, kv_lens)


def test_decode_attention_ref_is_softmax_attention_over_the_request_slots():
    (q, kc, vc, table, rows, lens), want = _decode_case(torch.float32, "cpu", hq=4, hkv=2, d=16, lens=(5, 9))
    for i in range(2):
        slots = table[rows[i], : lens[i]].long()
        k = kc[slots].repeat_interleave(2, dim=1).transpose(0, 1)  # [heads, n, d]
        v = vc[slots].repeat_interleave(2, dim=1).transpose(0, 1)
        naive = F.scaled_dot_product_attention(q[i][:, None], k, v)[:, 0]
        torch.testing.assert_close(want[i], naive, atol=1e-5, rtol=1e-5)


def _decode_checks(dtype, device, tol, sms, splits_to_try=(1, 4, 64), **case):
    """The kernel against the reference at every split count the engine can pick, twice in a row
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
        # the large-batch tile: 128 keys a step, two pipeline stages; one split a request, as from LARGE_DECODE_ONE_SPLIT_MIN_BS
        for splits in (1, 2):
            for _ in range(2):
                got = K.decode_attention(*args, scratch, splits, K.LARGE_BATCH_BLOCK, K.LARGE_BATCH_STAGES)
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
        for splits, tile in ((1, {}), (4, {}), (1, large := dict(block=K.LARGE_BATCH_BLOCK, stages=K.LARGE_BATCH_STAGES)), (2, large)):
            plain = K.decode_attention(*args, scratch, splits, **tile)
            listed = K.decode_attention(q, kc, vc, table, rows[order.long()], kv_lens[order.long()], scratch, splits, order=order, **tile)
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
    its output and the caches it leaves against RoPE and the store first (the reference), then
    attention, with and without qk-norm, at the engine's split counts and both tiles."""
    torch.manual_seed(1)
    for page_size, qk_norm in ((1, True), (16, False)):
        (q0, kc0, vc0, table, rows, kv_lens), _ = _decode_case(dtype, device, hq, hkv, d, lens, page_size)
        bs = len(lens)
        q, k, v = _qkv(bs, hq, hkv, d, dtype, device)
        out_loc = table[rows.long(), kv_lens.long() - 1].long()  # each request's new key: its last position
        positions = (kv_lens - 1).long() + torch.randint(0, 7, (bs,), device=device)  # need not match the length
        rope = RotaryEmbedding(d, 2048, 1e6, None, torch.device(device))
        norm = (torch.randn(d, dtype=dtype, device=device), torch.randn(d, dtype=dtype, device=device), 1e-6) if qk_norm else None
        pending = K.PendingRope(positions, k, v, out_loc, rope._cos, rope._sin, norm)
        kc, vc = kc0.clone(), vc0.clone()
        want_q = K.apply_rope_and_store_ref(positions, q, k, v, rope._cos, rope._sin, kc, vc, out_loc, norm)
        want = K.decode_attention_ref(want_q, kc, vc, table, rows, kv_lens)
        scratch = K.DecodeScratch.for_batches(bs, hkv, hq // hkv, d, 1 << 20, q.device)
        tiles = [(s, {}) for s in sorted({1, 4, K.decode_splits(bs, hkv, sms)})] + [(2, dict(block=K.LARGE_BATCH_BLOCK, stages=K.LARGE_BATCH_STAGES))]
        for splits, tile in tiles:
            got_kc, got_vc = kc0.clone(), vc0.clone()
            got = K.decode_attention(q, got_kc, got_vc, table, rows, kv_lens, scratch, splits, rope=pending, **tile)
            torch.testing.assert_close(got.float(), want.float(), atol=tol, rtol=tol)
            torch.testing.assert_close(got_kc.float(), kc.float(), atol=tol, rtol=tol)  # only the new keys moved
            assert torch.equal(got_vc, vc)
            assert int(scratch.count.abs().sum()) == 0
            # entries in another order (shortest first): each rotates and stores its own request's key, and
            # writes its output row
            order = torch.argsort(kv_lens, stable=True).to(torch.int32)
            got_kc, got_vc = kc0.clone(), vc0.clone()
            listed = K.decode_attention(q, got_kc, got_vc, table, rows[order.long()], kv_lens[order.long()], scratch, splits, rope=pending,
                                        order=order, **tile)
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


def test_decode_attention_with_rope_falls_back_to_rope_then_attention_on_the_cpu():
    _decode_rope_checks(torch.float32, "cpu", 1e-5, sms=8, hq=4, hkv=2, d=16, lens=(1, 2, 33, 70))


@gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_decode_attention_with_rope_kernel(dtype):
    _decode_rope_checks(dtype, "cuda", 2e-2, torch.cuda.get_device_properties(0).multi_processor_count)


def _pieces_case(dtype, device, lens=(1, 5, 9, 300), pieces=(1, 2, 3, 4), heads=4, d=32):
    """Attention of each request over all its keys, and over consecutive pieces of them (output
    and base-2 log-sum-exp per piece, as FlashInfer returns them), plus one padding row."""
    torch.manual_seed(0)
    outs, lses, starts, want = [], [], [0], []
    for n, p in zip(lens, pieces):
        q, k, v = torch.randn(heads, d), torch.randn(n, heads, d), torch.randn(n, heads, d)
        scores = torch.einsum("hd,nhd->hn", q, k) / math.sqrt(d)
        want.append(torch.einsum("hn,nhd->hd", scores.softmax(-1), v))
        cuts = [j * n // p for j in range(p + 1)]
        for a, b in zip(cuts, cuts[1:]):
            outs.append(torch.einsum("hn,nhd->hd", scores[:, a:b].softmax(-1), v[a:b]))
            lses.append(torch.logsumexp(scores[:, a:b], -1) / math.log(2))
        starts.append(starts[-1] + p)
    o = torch.stack([*outs, torch.randn(heads, d)]).to(device, dtype)  # the last row pads: never read
    lse = torch.stack([*lses, torch.randn(heads)]).to(device)
    return (o, lse, torch.tensor(starts, dtype=torch.int32, device=device)), torch.stack(want).to(device)


def test_merged_pieces_are_attention_over_all_the_keys():
    (o, lse, part_start), want = _pieces_case(torch.float32, "cpu")
    torch.testing.assert_close(K.merge_pieces_ref(o, lse, part_start), want, atol=1e-5, rtol=1e-5)


_MERGE_INTERPRETED = """
import torch, sys
sys.path.insert(0, {tests!r})
from test_ch19_kernels import _pieces_case
from minisgl import kernel as K
(o, lse, part_start), want = _pieces_case(torch.float32, "cpu")
torch.testing.assert_close(K.merge_pieces(o, lse, part_start), want, atol=1e-5, rtol=1e-5)
print("ok")
"""


def test_merge_pieces_kernel_under_the_triton_interpreter():
    _interpret(_MERGE_INTERPRETED)


@gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_merge_pieces_kernel(dtype):
    (o, lse, part_start), want = _pieces_case(dtype, "cuda", d=128, heads=16)
    torch.testing.assert_close(K.merge_pieces(o, lse, part_start).float(), want, atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(K.merge_pieces(o, lse, part_start), K.merge_pieces_ref(o, lse, part_start), atol=1e-2, rtol=1e-2)


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
    monkeypatch.setattr(cpu_gemm, "ENV", dataclasses.replace(cpu_gemm.ENV, disable_onednn=True))
    assert torch.equal(K.cpu_linear(x, w), F.linear(x, w))  # MINISGL_DISABLE_ONEDNN=1
