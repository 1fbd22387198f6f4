"""The pass that puts the kernels into a loaded model: the model and layer code stay plain PyTorch.

After the weights are loaded, the engine runs `swap_in_kernels` once over the model (the pass that
`minisgl/engine/kernel_pass.py` registers with the engine's `after_load`). On a GPU, each
layer that a kernel serves becomes its kernel-backed class (`GPU_LAYERS`, the same object with
its weights, another forward). On the CPU in float32, each projection's weight is converted to
oneDNN's blocked layout and the plain copy dropped (`cpu_gemm`), and the projections and the LM head
multiply through oneDNN. `MINISGL_DISABLE_KERNELS=1` leaves a GPU model plain; `MINISGL_DISABLE_ONEDNN=1`
a CPU one.
"""

from __future__ import annotations

from collections import Counter
from typing import Dict, Iterator, Optional

import torch

from minisgl.layers.base import BaseOP, OPList
from minisgl.layers.embedding import ParallelLMHead
from minisgl.layers.linear import _Linear
from minisgl.layers.rotary import QKNormRope, RotaryEmbedding

from . import cpu_gemm
from .layers import CPU_LAYERS, GPU_LAYERS
from .util import kernels_enabled


def layers_of(model: BaseOP) -> Iterator[BaseOP]:
    """Every layer reachable from `model`, once each: its children, and the layers it holds privately
    (the rotary embedding inside an attention layer's `QKNormRope`, a tied reference)."""
    seen, todo = set(), [model]
    while todo:
        obj = todo.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, BaseOP):
            yield obj
        values = obj.ops if isinstance(obj, OPList) else vars(obj).values()
        todo += [v for v in values if isinstance(v, (BaseOP, QKNormRope))]


def _where(op: BaseOP) -> torch.Tensor:
    """The tensor whose device and dtype the layer runs in."""
    if isinstance(op, RotaryEmbedding):
        return op.cos
    if isinstance(op, ParallelLMHead) and op._tied is not None:
        return op._tied.weight
    return op.weight


def _kernel_class(op: BaseOP) -> Optional[type]:
    """The class `op` becomes, or None to leave it as it is; packs a CPU projection's weight on the way."""
    if type(op) not in GPU_LAYERS and type(op) not in CPU_LAYERS:
        return None  # not a layer a kernel serves, or one the pass already swapped
    if _where(op).is_cuda:
        return GPU_LAYERS.get(type(op)) if kernels_enabled() else None
    cls = CPU_LAYERS.get(type(op))
    if isinstance(op, _Linear) and cpu_gemm.packable(op.weight):
        op.weight = cpu_gemm.pack(op.weight)  # the plain copy goes when nothing else holds it
    if isinstance(op, _Linear) and op.weight.is_mkldnn:  # packed now or by an earlier pass (shared weights)
        return cls
    return cls if isinstance(op, ParallelLMHead) and cpu_gemm.packable(_where(op)) else None


def swap_in_kernels(model: BaseOP) -> Dict[str, int]:
    """Give every layer of `model` that a kernel serves on its device its kernel-backed class, in place.
    Returns how many layers of each class changed. Running it again changes nothing."""
    swapped: Counter = Counter()
    for op in list(layers_of(model)):
        cls = _kernel_class(op)
        if cls is not None and type(op) is not cls:
            swapped[type(op).__name__] += 1
            op.__class__ = cls
    cpu_gemm.give_back_freed_memory()  # the memory of the plain weights that packing dropped
    return dict(swapped)
