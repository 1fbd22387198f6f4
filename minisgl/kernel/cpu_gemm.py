"""Float32 projections on the CPU through oneDNN, with each weight in oneDNN's blocked layout.

`F.linear` on the CPU goes to MKL's GEMM, which on the small row counts of decoding runs far below
the machine's rate. oneDNN's GEMM takes the weight already in its own blocked layout. The kernel pass
(`swap_in_kernels`) converts each projection's weight once after loading (`pack`) and the engine holds
only that copy, so its weights take no more memory than the plain ones. Any other float32 weight (the
tied LM head's, a test's tensor) is converted at its first product and the copy kept on the weight
tensor, tagged with the tensor's version counter, so a weight loaded or edited in place is converted
again. `MINISGL_DISABLE_ONEDNN=1` goes back to `F.linear` on plain weights.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from dataclasses import dataclass, field
from typing import Optional

import torch
import torch.nn.functional as F

from minisgl.env import declare_switches, switch

_ATTR = "_minisgl_onednn"  # (weight version, reordered weight) kept on the weight tensor
_ROWS_HINT = 32  # the row count the blocked layout is chosen for; any count runs with it


def _available() -> bool:
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


@dataclass(frozen=True)
class CpuGemmSwitches:
    disable_onednn: bool = field(default=False, metadata=switch(
        "float32 projections on the CPU through F.linear (MKL), not oneDNN: no second copy of the "
        "weights, transformers' rounding"))


ONEDNN = _available()
CPU_GEMM_ENV = declare_switches(CpuGemmSwitches)


def packable(weight: torch.Tensor) -> bool:
    """A float32 matrix on the CPU that is not part of autograd, with oneDNN on."""
    return (ONEDNN and not CPU_GEMM_ENV.disable_onednn and weight.device.type == "cpu" and weight.dtype == torch.float32
            and weight.dim() == 2 and not weight.is_mkldnn and not weight.requires_grad)


def cpu_gemm_applies(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Float32 on the CPU, and a weight whose edits can be seen: an inference-mode tensor keeps no
    version counter (the engine's weights are ordinary tensors), one that needs gradients is not
    ours to copy."""
    return packable(weight) and x.device.type == "cpu" and x.dtype == torch.float32 and not weight.is_inference()


def pack(weight: torch.Tensor) -> torch.Tensor:
    """`weight` (`[out, in]`) in oneDNN's blocked layout: an opaque tensor of the same shape and dtype
    that `cpu_linear` multiplies by and `plain` turns back, to hold instead of the plain one."""
    return torch.ops.mkldnn._reorder_linear_weight(weight, _ROWS_HINT)


def plain(weight: torch.Tensor) -> torch.Tensor:
    """The weight in the ordinary layout: a packed weight converted back (a new tensor, the same
    values), any other returned as it is."""
    return weight.to_dense() if weight.is_mkldnn else weight


def give_back_freed_memory() -> None:
    """Return the memory of freed tensors to the system (glibc only; elsewhere nothing to do). glibc
    keeps freed blocks that sit between live ones for this process alone: after packing, the plain
    weights."""
    name = ctypes.util.find_library("c")
    libc = ctypes.CDLL(name) if name else None
    if libc is not None and hasattr(libc, "malloc_trim"):
        libc.malloc_trim(0)


def _reordered(weight: torch.Tensor) -> torch.Tensor:
    cached = getattr(weight, _ATTR, None)
    if cached is None or cached[0] != weight._version:
        cached = (weight._version, pack(weight))
        setattr(weight, _ATTR, cached)
    return cached[1]


def cpu_linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """`F.linear(x, weight, bias)` for float32 on the CPU, through the weight in oneDNN's layout
    (`weight` itself when it is packed)."""
    if weight.is_mkldnn:
        if x.device.type != "cpu" or x.dtype != torch.float32:
            raise TypeError(f"a packed (oneDNN) weight multiplies float32 CPU activations, got {x.dtype} on "
                            f"{x.device}; use cpu_gemm.plain(weight) for anything else")
        packed = weight
    elif cpu_gemm_applies(x, weight):
        packed = _reordered(weight)
    else:
        return F.linear(x, weight, bias)
    rows = x.reshape(-1, x.shape[-1])
    out = torch.ops.mkldnn._linear_pointwise(rows, packed, bias, "none", [], "")
    return out.reshape(*x.shape[:-1], weight.shape[0])
