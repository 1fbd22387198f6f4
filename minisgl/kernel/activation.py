"""`silu(gate) * up` in one kernel (the layer's PyTorch function takes three: chunk views, silu, product)."""

from __future__ import annotations

import torch

from .util import next_pow2, use_triton

try:
    import triton
    import triton.language as tl

    @triton.jit
    def _silu_mul_kernel(x_ptr, out_ptr, x_stride, INTER: tl.constexpr, BLOCK: tl.constexpr):
        t = tl.program_id(0).to(tl.int64)
        offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < INTER
        gate = tl.load(x_ptr + t * x_stride + offs, mask=mask, other=0.0)
        up = tl.load(x_ptr + t * x_stride + INTER + offs, mask=mask, other=0.0)
        g = gate.to(tl.float32)
        act = (g / (1.0 + tl.exp(-g))).to(gate.dtype)  # silu, rounded like F.silu's output
        tl.store(out_ptr + t * INTER + offs, act * up, mask=mask)

except ImportError:  # pragma: no cover
    triton = None


def silu_and_mul_fits(x: torch.Tensor) -> bool:
    """Whether `silu_and_mul` takes `x`: Triton on its device, `[tokens, 2 * inter]` with unit-stride rows."""
    return use_triton(x) and x.dim() == 2 and x.stride(-1) == 1


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """`layers.activation.silu_and_mul` in one launch: `[tokens, 2 * inter]` = `[gate | up]` -> `[tokens, inter]`;
    `x` must pass `silu_and_mul_fits`."""
    assert silu_and_mul_fits(x)
    t, two_i = x.shape
    inter = two_i // 2
    out = torch.empty(t, inter, dtype=x.dtype, device=x.device)
    if t == 0:
        return out
    block = min(next_pow2(inter), 1024)
    _silu_mul_kernel[(t, triton.cdiv(inter, block))](x, out, x.stride(0), INTER=inter, BLOCK=block)
    return out
