"""Fused mixture of experts on the GPU: two grouped GEMMs in Triton.

After `moe_align_block_size` every tile of BLOCK_M rows belongs to one expert, so a program
loads that expert's weight tile and multiplies it with the gathered token rows; no per-expert
Python loop and no copy of the tokens into per-expert buffers.

    rows r = t*top_k + k          (token t's k-th expert)
    GEMM 1: h[r]   = x[t] @ w13[e]^T          [rows, 2*inter]
            a[r]   = silu(gate) * up          [rows, inter]     (the activation kernel)
    GEMM 2: y[r]   = w_r * a[r] @ w2[e]^T     [rows, hidden]    (routing weight folded in)
    out[t] = sum over k of y[t*top_k + k]                       (PyTorch)

Imported only when Triton is present (CUDA builds of PyTorch ship it).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from minisgl.kernel.activation import silu_and_mul as fused_silu_and_mul
from minisgl.kernel.activation import silu_and_mul_fits
from minisgl.layers.activation import silu_and_mul

from .align import AlignedRows, moe_align_block_size


@triton.jit
def _grouped_gemm_kernel(
    # a [a_rows, K] (row r reads a[r // a_div]); b [experts, N, K]; c [rows, N]; weights [rows]
    a_ptr, b_ptr, c_ptr, weight_ptr,
    sorted_ids_ptr, expert_ids_ptr, num_padded_ptr, num_rows, N, K, a_div,
    stride_am, stride_ak, stride_be, stride_bn, stride_bk, stride_cm, stride_cn,
    MUL_WEIGHT: tl.constexpr,  # scale each row by its routing weight
    IEEE: tl.constexpr,  # float32 inputs: exact fp32 products instead of TF32
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    if pid_m * BLOCK_M >= tl.load(num_padded_ptr):
        return  # a block past the used rows (the buffers are sized for the worst case)
    expert = tl.load(expert_ids_ptr + pid_m).to(tl.int64)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rows = tl.load(sorted_ids_ptr + offs_m)
    valid = rows < num_rows  # padding rows hold num_rows
    a_rows = (rows // a_div).to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + a_rows[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + expert * stride_be + offs_n[None, :] * stride_bn + offs_k[:, None] * stride_bk
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k_ok = offs_k + k0 < K
        a = tl.load(a_ptrs, mask=valid[:, None] & k_ok[None, :], other=0.0)
        b = tl.load(b_ptrs, mask=k_ok[:, None] & (offs_n[None, :] < N), other=0.0)
        if IEEE:
            acc += tl.dot(a, b, input_precision="ieee")
        else:
            acc += tl.dot(a, b)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    if MUL_WEIGHT:
        w = tl.load(weight_ptr + rows, mask=valid, other=0.0)
        acc = acc * w[:, None].to(tl.float32)
    c_ptrs = c_ptr + rows.to(tl.int64)[:, None] * stride_cm + offs_n[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=valid[:, None] & (offs_n[None, :] < N))


def _grouped_gemm(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, aligned: AlignedRows, a_div: int,
                  weights: torch.Tensor | None) -> None:
    num_rows, n = c.shape
    k = b.shape[2]
    block_n = 64 if n >= 64 else 32
    block_k = 64 if k >= 64 else 32
    grid = (aligned.max_blocks, triton.cdiv(n, block_n))
    _grouped_gemm_kernel[grid](
        a, b, c, weights if weights is not None else c, aligned.sorted_ids, aligned.expert_ids, aligned.num_padded,
        num_rows, n, k, a_div,
        a.stride(0), a.stride(1), b.stride(0), b.stride(1), b.stride(2), c.stride(0), c.stride(1),
        MUL_WEIGHT=weights is not None,
        IEEE=a.dtype == torch.float32,
        BLOCK_M=aligned.block_size, BLOCK_N=block_n, BLOCK_K=block_k,
    )  # fmt: skip


def block_size_for(num_rows: int, num_experts: int) -> int:
    """Small batches (decode) waste less padding with short tiles; large ones want long tiles."""
    return 16 if num_rows <= 2 * num_experts * 16 else 64


def fused_moe(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
              topk_ids: torch.Tensor) -> torch.Tensor:
    """Same contract as `moe_forward_torch`: `[tokens, hidden]` in, `[tokens, hidden]` out."""
    tokens, top_k = topk_ids.shape
    num_experts, two_inter, hidden = w13.shape
    num_rows = tokens * top_k
    aligned = moe_align_block_size(topk_ids, block_size_for(num_rows, num_experts), num_experts)
    h = torch.empty(num_rows, two_inter, dtype=x.dtype, device=x.device)
    _grouped_gemm(x, w13, h, aligned, top_k, None)
    act = fused_silu_and_mul(h) if silu_and_mul_fits(h) else silu_and_mul(h)  # one launch where Triton runs
    y = torch.empty(num_rows, hidden, dtype=x.dtype, device=x.device)
    _grouped_gemm(act, w2, y, aligned, 1, topk_weights.flatten().contiguous())
    return y.view(tokens, top_k, hidden).sum(dim=1)
