"""When to use a Triton kernel, and small launch helpers."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from minisgl.env import declare_switches, switch

try:  # Triton ships with CUDA builds of PyTorch; CPU-only installs usually lack it
    import triton  # noqa: F401

    _HAS_TRITON = True
except ImportError:  # pragma: no cover - depends on the install
    _HAS_TRITON = False


@dataclass(frozen=True)
class KernelSwitches:
    disable_kernels: bool = field(default=False, metadata=switch(
        "no Triton kernel on a GPU: the kernel pass leaves the layers plain PyTorch, backends run the "
        "plain sequence"))
    triton_interpret: bool = field(default=False, metadata=switch(
        "Triton's own interpreter: the kernels then run on CPU tensors too", "TRITON_INTERPRET"))


KERNEL_ENV = declare_switches(KernelSwitches)


def triton_available() -> bool:
    return _HAS_TRITON


def kernels_enabled() -> bool:
    """Triton imports and `MINISGL_DISABLE_KERNELS` is not set."""
    return _HAS_TRITON and not KERNEL_ENV.disable_kernels


def use_triton(t: torch.Tensor) -> bool:
    """Triton for CUDA tensors; on the CPU only under Triton's interpreter (TRITON_INTERPRET=1),
    which is how the kernels can be checked on a machine without a GPU."""
    return kernels_enabled() and (t.is_cuda or KERNEL_ENV.triton_interpret)


def next_pow2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()
