"""Projections of one or two rows (a decode step of 1-2 requests) as a matrix-vector kernel.

For one row, `F.linear` goes to cuBLAS, whose tiles cover 64 output features at a time, so a narrow
projection runs on a few SMs and reads its weights far below the card's bandwidth. Here each program
owns two output features and reads their whole rows of the weight at once, so even a narrow
projection spreads over hundreds of programs. From three rows on, cuBLAS's tensor-core tiles win.

The gate/up projection of the MLP can also finish with `silu(gate) * up`: a program computes
feature j of the gate and of the up half together and writes only their product, so the
activation kernel and the `[rows, 2 * inter]` intermediate disappear.

The RMSNorm before a projection can go into the same launch (`PendingNorm`, used by `fold.py`):
the norm's `1 / rms` is one factor per row, so the kernel adds the residual, squares and scales by
the norm's weight as it reads the row, and multiplies the finished sums by `1 / rms`.

Products are summed in float32 and rounded once to the activations' dtype, as cuBLAS does, but
in a different order: outputs agree with `F.linear` to the dtype's rounding, not bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from minisgl.layers.activation import silu_and_mul as plain_silu_and_mul

from .activation import silu_and_mul, silu_and_mul_fits
from .cpu_gemm import cpu_linear
from .util import next_pow2, use_triton

GEMV_MAX_ROWS = 2  # up to this many rows the kernel beats cuBLAS (measured: minisgl/benchmark/RESULTS.md)
_DTYPES = (torch.bfloat16, torch.float16)  # float32 keeps cuBLAS: exact parity is tested there
_BLOCK_N = 2  # output features per program
# (weight columns a load, warps a program): one row takes long loads on two warps, so more programs
# share an SM; more rows multiply the accumulators, so their loads shrink with the rows, on four warps
_ONE_ROW_TILE = (2048, 2)
_ROWS_TILE = (1024, 4)  # columns for one row's worth of accumulators; divided by the rows (padded)


@dataclass
class PendingNorm:
    """An RMSNorm (with its residual add) left for the projection that reads its output to compute:
    the projection's input is `rmsnorm(x + residual) * weight` (`x` alone when `residual` is None), and
    its launch also writes the norm's two outputs, `out` (the normed rows) and `summed` (`x + residual`,
    the new residual stream; `x` itself when there is no residual)."""

    x: torch.Tensor
    residual: Optional[torch.Tensor]
    weight: torch.Tensor
    eps: float
    out: torch.Tensor
    summed: torch.Tensor


try:
    import triton
    import triton.language as tl

    @triton.jit
    def _gemv_kernel(x_ptr, w_ptr, b_ptr, out_ptr, res_ptr, nw_ptr, sum_ptr, h_ptr, eps, N, M: tl.constexpr,
                     K: tl.constexpr, MP: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, HAS_BIAS: tl.constexpr,
                     SILU_MUL: tl.constexpr, NORM: tl.constexpr, HAS_RES: tl.constexpr):
        # out[m, n] = sum_k x[m, k] * w[n, k] (+ b[n]); with SILU_MUL, w is [gate | up] (2N rows)
        # and out[m, n] = silu(gate[m, n]) * up[m, n]. With NORM the input row is rmsnorm(s) * nw for
        # s = x + res (HAS_RES) or x. One pass over K, every load issued together.
        pid = tl.program_id(0)
        n = pid * BN + tl.arange(0, BN)
        m = tl.arange(0, MP)
        n_ok, m_ok = n < N, m < M
        acc = tl.zeros([MP, BN, BK], dtype=tl.float32)
        acc_up = tl.zeros([MP, BN, BK], dtype=tl.float32)
        sq = tl.zeros([MP, BK], dtype=tl.float32)
        for k0 in tl.static_range(0, K, BK):  # unrolled: every load is issued before the sums
            k = k0 + tl.arange(0, BK)
            k_ok = k < K
            x_at, x_ok = m[:, None] * K + k[None, :], m_ok[:, None] & k_ok[None, :]
            x = tl.load(x_ptr + x_at, mask=x_ok, other=0.0)
            if NORM:  # square and weigh the row here; its 1 / rms multiplies the finished sums
                if HAS_RES:
                    x = x + tl.load(res_ptr + x_at, mask=x_ok, other=0.0)  # rounded to the dtype, as the layer's add
                sq += x.to(tl.float32) * x.to(tl.float32)
                x = x.to(tl.float32) * tl.load(nw_ptr + k, mask=k_ok, other=0.0).to(tl.float32)[None, :]
            x = x.to(tl.float32)
            w_at = w_ptr + n[:, None].to(tl.int64) * K + k[None, :]
            w_ok = n_ok[:, None] & k_ok[None, :]
            acc += x[:, None, :] * tl.load(w_at, mask=w_ok, other=0.0).to(tl.float32)[None, :, :]
            if SILU_MUL:
                acc_up += x[:, None, :] * tl.load(w_at + N * K, mask=w_ok, other=0.0).to(tl.float32)[None, :, :]
        y = tl.sum(acc, axis=2)
        y_up = tl.sum(acc_up, axis=2)
        if NORM:
            inv = tl.rsqrt(tl.sum(sq, axis=1) / K + eps)[:, None]  # [MP, 1]
            y = y * inv
            y_up = y_up * inv
        if HAS_BIAS:
            y += tl.load(b_ptr + n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
        if SILU_MUL:  # rounded as silu_and_mul rounds: both halves, then silu, then the product
            g = y.to(out_ptr.dtype.element_ty).to(tl.float32)
            up = y_up.to(out_ptr.dtype.element_ty)
            y = (g / (1.0 + tl.exp(-g))).to(out_ptr.dtype.element_ty) * up
        tl.store(out_ptr + m[:, None] * N + n[None, :], y.to(out_ptr.dtype.element_ty),
                 mask=m_ok[:, None] & n_ok[None, :])
        if NORM and pid == 0:  # one program also writes the norm's own outputs
            _norm_outputs(x_ptr, res_ptr, nw_ptr, sum_ptr, h_ptr, inv, m, m_ok, K, BK, HAS_RES)

    @triton.jit
    def _norm_outputs(x_ptr, res_ptr, nw_ptr, sum_ptr, h_ptr, inv, m, m_ok, K: tl.constexpr, BK: tl.constexpr,
                      HAS_RES: tl.constexpr):
        # the sum (when there is a residual) and rmsnorm(sum) * nw, rounded as the layer rounds them
        for k0 in tl.static_range(0, K, BK):
            k = k0 + tl.arange(0, BK)
            x_at, x_ok = m[:, None] * K + k[None, :], m_ok[:, None] & (k < K)[None, :]
            s = tl.load(x_ptr + x_at, mask=x_ok, other=0.0)
            if HAS_RES:
                s = s + tl.load(res_ptr + x_at, mask=x_ok, other=0.0)
                tl.store(sum_ptr + x_at, s, mask=x_ok)
            nw = tl.load(nw_ptr + k, mask=k < K, other=0.0)
            tl.store(h_ptr + x_at, (s.to(tl.float32) * inv).to(nw.dtype) * nw[None, :], mask=x_ok)

except ImportError:  # pragma: no cover
    triton = None


def gemv_applies(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether `linear` runs the matrix-vector kernel for these operands."""
    return (
        use_triton(x)
        and x.dim() == 2
        and 0 < x.shape[0] <= GEMV_MAX_ROWS
        and x.dtype in _DTYPES
        and weight.dtype == x.dtype
        and x.is_contiguous()
        and weight.is_contiguous()
    )


def gemv(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None, silu_mul: bool = False,
         norm: Optional[PendingNorm] = None) -> torch.Tensor:
    """The kernel itself, for any dtype Triton takes (`linear` decides when to use it):
    `x @ weight.T + bias`, or with `silu_mul` `silu(x @ gate.T) * (x @ up.T)` for `weight = [gate; up]`.
    With `norm`, `x` is `norm.out`, which this launch writes (and `norm.summed`) as it projects."""
    if norm is not None:
        assert x is norm.out, "the projection must read the pending norm's output"
        x = norm.x
    rows, k = x.shape
    fits = weight.shape[1] == k and not (silu_mul and weight.shape[0] % 2)
    assert fits, f"weight {tuple(weight.shape)} does not fit x {tuple(x.shape)}"
    n = weight.shape[0] // 2 if silu_mul else weight.shape[0]
    out = torch.empty(rows, n, dtype=x.dtype, device=x.device)
    mp = next_pow2(rows)
    # the same tiles with the norm inside: four features a program (fewer reads of the row) were slower
    block_k, warps = _ONE_ROW_TILE if rows == 1 else (_ROWS_TILE[0] // mp, _ROWS_TILE[1])
    bk = min(next_pow2(k), block_k)
    res = norm.residual if norm is not None else None
    nw, summed, h, eps = (norm.weight, norm.summed, norm.out, norm.eps) if norm is not None else (x, x, x, 0.0)
    _gemv_kernel[(triton.cdiv(n, _BLOCK_N),)](
        x, weight, bias if bias is not None else weight, out, res if res is not None else x, nw, summed, h, eps, n,
        M=rows, K=k, MP=mp, BN=_BLOCK_N, BK=bk, HAS_BIAS=bias is not None, SILU_MUL=silu_mul,
        NORM=norm is not None, HAS_RES=res is not None, num_warps=warps,
    )
    return out


def linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """`F.linear(x, weight, bias)`; for up to `GEMV_MAX_ROWS` rows of 16-bit activations on a GPU,
    the kernel; for float32 on the CPU, oneDNN with the weight reordered once (`cpu_gemm`)."""
    if gemv_applies(x, weight):
        return gemv(x, weight, bias)
    return cpu_linear(x, weight, bias)  # F.linear wherever oneDNN's path does not apply


def linear_silu_and_mul(x: torch.Tensor, gate_up: torch.Tensor) -> torch.Tensor:
    """`silu_and_mul(x @ gate_up.T)` for `gate_up = [gate; up]` (`[2 * inter, hidden]`): one kernel for
    few rows, otherwise `linear` and then the activation (its kernel where it takes the product)."""
    if gemv_applies(x, gate_up):
        return gemv(x, gate_up, silu_mul=True)
    y = linear(x, gate_up)
    return silu_and_mul(y) if silu_and_mul_fits(y) else plain_silu_and_mul(y)
