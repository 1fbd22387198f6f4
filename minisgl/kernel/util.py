"""When to use a Triton kernel, and small launch helpers."""

from __future__ import annotations

import torch

from minisgl.env import ENV

try:  # Triton ships with CUDA builds of PyTorch; CPU-only installs usually lack it
    import triton  # noqa: F401

    _HAS_TRITON = True
except ImportError:  # pragma: no cover - depends on the install
    _HAS_TRITON = False


def triton_available() -> bool:
    return _HAS_TRITON


def kernels_enabled() -> bool:
    """Triton imports and `MINISGL_DISABLE_KERNELS` is not set."""
    return _HAS_TRITON and not ENV.disable_kernels


def use_triton(t: torch.Tensor) -> bool:
    """Triton for CUDA tensors; on the CPU only under Triton's interpreter (TRITON_INTERPRET=1),
    which is how the kernels can be checked on a machine without a GPU."""
    return kernels_enabled() and (t.is_cuda or ENV.triton_interpret)


def next_pow2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()
