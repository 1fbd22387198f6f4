"""A split-K tensor-core projection kernel for 3-256 rows that merges its own partial sums: tried
as a replacement for cuBLAS in decode steps and not kept (`small_gemm_tiles.py` times it; RESULTS.md,
"Keys in pieces, kept; projections of 3-256 rows, not"). It lives here, with the probe that measured it.

cuBLAS tiles the output, so a 1,024-wide projection (`o_proj`, `down_proj` of Qwen3-0.6B) has few
tiles for the H200's 132 SMs. Here a program owns `BN` output features, `BM` rows and one of `split`
consecutive slices of the inner dimension; the weight tile is the left operand of the tensor-core
product (`out^T = W x^T`), so even 16 rows fill it. Each program writes its float32 partial tile and
the last program of a tile (an atomic counter says which) adds the partials in a fixed order and
finishes the tile: no second kernel, the same result on every run, counters back at zero at the end.
The finish can fold in `silu(gate) * up` (weight `[gate; up]`) and a preceding add+RMSNorm (the
programs of the first output tile write `x + residual`, each program sums the squares of its slice,
the finishing program scales by `1 / rms`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional, Tuple

import torch

from minisgl.kernel.util import next_pow2, use_triton


@dataclass(frozen=True)
class GemmTile:
    """One launch configuration: output features, rows and inner columns per program step, and
    how many slices the inner dimension is cut into."""

    bn: int
    bm: int
    bk: int
    split: int
    warps: int = 4
    stages: int = 4


try:
    import triton
    import triton.language as tl

    @triton.jit(do_not_specialize=["M"])  # one compilation for every row count
    def _gemm_kernel(x_ptr, w_ptr, out_ptr, part_ptr, sq_ptr, count_ptr, res_ptr, nw_ptr, sum_ptr, eps,
                     M, N, K, K_CHUNK, SPLIT,
                     BN: tl.constexpr, BM: tl.constexpr, BK: tl.constexpr,
                     SILU_MUL: tl.constexpr, NORM: tl.constexpr, HAS_RES: tl.constexpr, STAGES: tl.constexpr):
        # out[m, n] = sum_k x[m, k] w[n, k]; with SILU_MUL w holds 2N rows, [gate; up]
        pid_n = tl.program_id(0)
        pid_m = tl.program_id(1)
        s = tl.program_id(2)
        n = pid_n * BN + tl.arange(0, BN)
        m = pid_m * BM + tl.arange(0, BM)
        n_ok = n < N
        m_ok = m < M
        acc = tl.zeros([BN, BM], dtype=tl.float32)
        acc_up = tl.zeros([BN, BM], dtype=tl.float32)
        sq = tl.zeros([BM], dtype=tl.float32)
        k_lo = s * K_CHUNK
        w_rows = w_ptr + n[:, None].to(tl.int64) * K
        for k0 in tl.range(k_lo, k_lo + K_CHUNK, BK, num_stages=STAGES):
            k = k0 + tl.arange(0, BK)
            k_ok = k < K
            x_at = m[:, None] * K + k[None, :]
            x_ok = m_ok[:, None] & k_ok[None, :]
            x = tl.load(x_ptr + x_at, mask=x_ok, other=0.0)  # [BM, BK]
            if NORM:
                if HAS_RES:
                    x = x + tl.load(res_ptr + x_at, mask=x_ok, other=0.0)  # rounded to the dtype, as the reference's add
                    if pid_n == 0:
                        tl.store(sum_ptr + x_at, x, mask=x_ok)
                xf = x.to(tl.float32)
                sq += tl.sum(xf * xf, axis=1)
                x = (xf * tl.load(nw_ptr + k, mask=k_ok, other=0.0).to(tl.float32)[None, :]).to(x_ptr.dtype.element_ty)
            w = tl.load(w_rows + k[None, :], mask=n_ok[:, None] & k_ok[None, :], other=0.0)  # [BN, BK]
            acc = tl.dot(w, tl.trans(x), acc)
            if SILU_MUL:
                w_up = tl.load(w_rows + N * K + k[None, :], mask=n_ok[:, None] & k_ok[None, :], other=0.0)
                acc_up = tl.dot(w_up, tl.trans(x), acc_up)
        if SPLIT > 1:
            # partials [tiles, SPLIT, BN, BM] (gate then up halves with SILU_MUL) and [tiles, SPLIT, BM]
            tile = pid_m * tl.num_programs(0) + pid_n
            cell = tl.arange(0, BN)[:, None] * BM + tl.arange(0, BM)[None, :]
            halves = 2 if SILU_MUL else 1
            part = part_ptr + (tile * SPLIT * halves) * (BN * BM)
            tl.store(part + s * (BN * BM) + cell, acc)
            if SILU_MUL:
                tl.store(part + (SPLIT + s) * (BN * BM) + cell, acc_up)
            if NORM:
                tl.store(sq_ptr + (tile * SPLIT + s) * BM + tl.arange(0, BM), sq)
            tl.debug_barrier()  # every thread's partials are written before the counter moves
            done = tl.atomic_add(count_ptr + tile, 1, sem="acq_rel")
            if done == SPLIT - 1:  # the last program of this tile adds the slices, in order
                acc = tl.zeros([BN, BM], dtype=tl.float32)
                acc_up = tl.zeros([BN, BM], dtype=tl.float32)
                sq = tl.zeros([BM], dtype=tl.float32)
                for i in range(SPLIT):
                    acc += tl.load(part + i * (BN * BM) + cell, cache_modifier=".cg")
                    if SILU_MUL:
                        acc_up += tl.load(part + (SPLIT + i) * (BN * BM) + cell, cache_modifier=".cg")
                    if NORM:
                        sq += tl.load(sq_ptr + (tile * SPLIT + i) * BM + tl.arange(0, BM), cache_modifier=".cg")
                tl.atomic_xchg(count_ptr + tile, 0)  # ready for the next launch
                _finish(acc, acc_up, sq, out_ptr, m, n, m_ok, n_ok, N, K, eps, SILU_MUL, NORM)
        else:
            _finish(acc, acc_up, sq, out_ptr, m, n, m_ok, n_ok, N, K, eps, SILU_MUL, NORM)

    @triton.jit
    def _finish(acc, acc_up, sq, out_ptr, m, n, m_ok, n_ok, N, K, eps, SILU_MUL: tl.constexpr, NORM: tl.constexpr):
        if NORM:
            inv = tl.rsqrt(sq / K + eps)[None, :]  # [1, BM]: rows are the tile's columns
            acc = acc * inv
            acc_up = acc_up * inv
        y = acc
        if SILU_MUL:  # rounded as silu_and_mul rounds: both halves, then silu, then the product
            g = acc.to(out_ptr.dtype.element_ty).to(tl.float32)
            up = acc_up.to(out_ptr.dtype.element_ty)
            y = (g / (1.0 + tl.exp(-g))).to(out_ptr.dtype.element_ty) * up
        tl.store(out_ptr + m[None, :] * N + n[:, None], y.to(out_ptr.dtype.element_ty), mask=m_ok[None, :] & n_ok[:, None])

except ImportError:  # pragma: no cover
    triton = None


_COUNTERS: Dict[torch.device, torch.Tensor] = {}
_MAX_TILES = 4096


def _counters(device: torch.device) -> torch.Tensor:
    """One zeroed int32 counter per output tile, shared by every launch on the device: launches on
    one stream run one after another and each leaves its counters at zero."""
    if device not in _COUNTERS:
        _COUNTERS[device] = torch.zeros(_MAX_TILES, dtype=torch.int32, device=device)
    return _COUNTERS[device]


def gemm_tiles(rows: int, n: int, k: int, tile: GemmTile) -> Tuple[int, int, int]:
    """The launch grid: output tiles, row tiles, slices."""
    return triton.cdiv(n, tile.bn), triton.cdiv(rows, tile.bm), tile.split


def gemm(x: torch.Tensor, weight: torch.Tensor, tile: GemmTile, silu_mul: bool = False,
         norm_weight: Optional[torch.Tensor] = None, residual: Optional[torch.Tensor] = None, eps: float = 0.0) -> Tuple[torch.Tensor, torch.Tensor]:
    """`x @ weight.T` (or `silu(x @ gate.T) * (x @ up.T)`, or either of `rmsnorm(x + residual) *
    norm_weight`) and the next residual (`x + residual`, `x` itself without a norm or residual)."""
    assert use_triton(x) and x.is_contiguous() and weight.is_contiguous() and x.dtype == weight.dtype
    rows, k = x.shape
    assert weight.shape[1] == k and not (silu_mul and weight.shape[0] % 2), f"weight {tuple(weight.shape)} does not fit x {tuple(x.shape)}"
    n = weight.shape[0] // 2 if silu_mul else weight.shape[0]
    chunk = triton.cdiv(triton.cdiv(k, tile.split), tile.bk) * tile.bk
    assert chunk * (tile.split - 1) < k, f"{tile} leaves a slice of {k} columns empty"
    grid = gemm_tiles(rows, n, k, tile)
    tiles = grid[0] * grid[1]
    out = torch.empty(rows, n, dtype=x.dtype, device=x.device)
    has_norm = norm_weight is not None
    summed = torch.empty_like(x) if residual is not None else x
    if tile.split > 1:
        assert tiles <= _MAX_TILES
        part = torch.empty(tiles * tile.split * (2 if silu_mul else 1) * tile.bn * tile.bm, dtype=torch.float32, device=x.device)
        sq = torch.empty(tiles * tile.split * tile.bm if has_norm else 1, dtype=torch.float32, device=x.device)
    else:
        part = sq = out
    _gemm_kernel[grid](
        x, weight, out, part, sq, _counters(x.device), residual if residual is not None else x,
        norm_weight if has_norm else x, summed, eps, rows, n, k, chunk, tile.split,
        BN=tile.bn, BM=tile.bm, BK=tile.bk, SILU_MUL=silu_mul, NORM=has_norm,
        HAS_RES=residual is not None, STAGES=tile.stages, num_warps=tile.warps,
    )
    return out, summed


def row_block(rows: int, cap: int = 64) -> int:
    """Rows per program: the row count rounded up to a power of two, 16 to `cap`."""
    return max(16, min(cap, next_pow2(rows)))
