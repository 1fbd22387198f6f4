"""Chapter 19: every fused kernel's PyTorch fallback computes what the layers compute, and the
triton-decode backend with its thresholds table is in the package."""

import torch

from minisgl import kernel
from minisgl.attention.registry import TRITON_DECODE_MODULE
from minisgl.attention.triton_decode_backend import THRESHOLDS
from minisgl.layers.activation import silu_and_mul
from minisgl.utils import package_has

torch.manual_seed(0)
x = torch.randn(5, 16)
assert torch.equal(kernel.silu_and_mul(x), silu_and_mul(x))
assert torch.equal(kernel.silu_and_mul_ref(x), silu_and_mul(x))
assert package_has(TRITON_DECODE_MODULE) and THRESHOLDS.max_head_dim == 128
print("triton available:", kernel.triton_available())
