"""Chapter 19: every fused kernel's PyTorch fallback computes what the layers compute."""

import torch

from minisgl import kernel
from minisgl.layers.activation import silu_and_mul

torch.manual_seed(0)
x = torch.randn(5, 16)
assert torch.equal(kernel.silu_and_mul(x), silu_and_mul(x))
assert torch.equal(kernel.silu_and_mul_ref(x), silu_and_mul(x))
print("triton available:", kernel.triton_available())
