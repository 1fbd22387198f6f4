"""Chapter 19: the kernel pass gives a loaded model's layers their kernel-backed classes (on the CPU,
oneDNN's projections) and they compute what the plain layers computed; the triton-decode backend
with its thresholds table is in the package."""

import torch

from minisgl import kernel
from minisgl.attention.registry import backend_names
from minisgl.attention.triton_decode_backend import THRESHOLDS
from minisgl.layers.linear import LinearReplicated

torch.manual_seed(0)
proj = LinearReplicated(16, 8, dtype=torch.float32, device=torch.device("cpu"))
proj.weight.copy_(torch.randn(8, 16))
x = torch.randn(3, 16)
want = proj(x)
swapped = kernel.swap_in_kernels(proj)
assert swapped in ({"LinearReplicated": 1}, {})  # {}: a build of torch without oneDNN keeps the plain layer
assert torch.allclose(proj(x), want, atol=1e-5)
assert "triton-decode" in backend_names() and THRESHOLDS.max_head_dim == 128
print("swapped:", swapped, "triton available:", kernel.triton_available())
