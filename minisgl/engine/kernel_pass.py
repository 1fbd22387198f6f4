"""The kernel passes, registered with the engine: every engine swaps the package's kernels into its
model's layers once the weights are in (`minisgl.kernel.swap`), then folds each layer's norms into the
projections that read them where both got kernels (`minisgl.kernel.fold`). Registered from the engine's side,
since the kernels sit below the engine. Importing the engine loads neither the kernels nor Triton
(an engine's attention backend or this pass does), so a program may still choose Triton's interpreter."""

from typing import Dict

from minisgl.layers.base import BaseOP

from .engine import after_load


@after_load("swap kernels into the model's layers")
def kernel_pass(model: BaseOP) -> Dict[str, int]:
    from minisgl.kernel.swap import swap_in_kernels

    return swap_in_kernels(model)


@after_load("fold each layer's norms into the projections that read them")
def fold_pass(model: BaseOP) -> int:
    from minisgl.kernel.fold import fold_norms

    return fold_norms(model)
