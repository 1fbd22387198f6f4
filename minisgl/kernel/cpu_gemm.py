"""Float32 projections on the CPU through oneDNN, with each weight reordered once.

`F.linear` on the CPU goes to MKL's GEMM, which on the small row counts of decoding runs far below
the machine's rate. oneDNN's GEMM takes the weight already in its own blocked layout: the engine
reorders each weight once and keeps the copy on the weight tensor, tagged with the tensor's version
counter, so a weight loaded or edited in place is reordered again. A decode step then runs about a
quarter faster (measured: minisgl/benchmark/RESULTS.md). The price is a
second copy of every projection's weight in host memory; `MINISGL_DISABLE_ONEDNN=1` goes back to
`F.linear`.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from minisgl.env import ENV

_ATTR = "_minisgl_onednn"  # (weight version, reordered weight) kept on the weight tensor
_ROWS_HINT = 32  # the row count the blocked layout is chosen for; any count runs with it


def _available() -> bool:
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


ONEDNN = _available()


def cpu_gemm_applies(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Float32 on the CPU, and a weight whose edits can be seen: an inference-mode tensor keeps no
    version counter (the engine's weights are ordinary tensors), one that needs gradients is not
    ours to copy."""
    return (
        ONEDNN and not ENV.disable_onednn and x.device.type == "cpu" and x.dtype == weight.dtype == torch.float32
        and weight.dim() == 2 and not weight.requires_grad and not weight.is_inference()
    )


def _reordered(weight: torch.Tensor) -> torch.Tensor:
    cached = getattr(weight, _ATTR, None)
    if cached is None or cached[0] != weight._version:
        cached = (weight._version, torch.ops.mkldnn._reorder_linear_weight(weight, _ROWS_HINT))
        setattr(weight, _ATTR, cached)
    return cached[1]


def cpu_linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """`F.linear(x, weight, bias)` for float32 on the CPU, through the reordered weight."""
    if not cpu_gemm_applies(x, weight):
        return F.linear(x, weight, bias)
    rows = x.reshape(-1, x.shape[-1])
    out = torch.ops.mkldnn._linear_pointwise(rows, _reordered(weight), bias, "none", [], "")
    return out.reshape(*x.shape[:-1], weight.shape[0])
