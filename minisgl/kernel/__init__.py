"""Fused GPU kernels (Triton) for the hot paths of a forward pass, and oneDNN's projections on the CPU.

The layers of `minisgl.layers` are the plain PyTorch reference. After loading, `swap_in_kernels` gives
each layer that a kernel serves a kernel-backed class (`kernel.layers`); the attention backends call the
attention kernels themselves. Each kernel entry point says which inputs it takes (its `*_fits` or
`*_applies` check), and the tests hold every kernel to the layer it replaces.
"""

from .activation import silu_and_mul, silu_and_mul_fits
from .cpu_gemm import cpu_linear
from .decode import DecodeScratch, DecodeTile, decode_attention, decode_rope_fits, decode_splits
from .gemv import GEMV_MAX_ROWS, gemv, gemv_applies, linear, linear_silu_and_mul
from .index import gather_page_indices, gather_page_indices_ref
from .norm import add_rmsnorm_fits, fused_add_rmsnorm, rmsnorm, rmsnorm_fits
from .rope import PendingRope, apply_rope, apply_rope_and_store, rope_and_store_fits, rope_fits
from .store import store_kv, store_kv_ref
from .swap import swap_in_kernels
from .util import kernels_enabled, triton_available

__all__ = [
    "DecodeScratch",
    "DecodeTile",
    "GEMV_MAX_ROWS",
    "PendingRope",
    "add_rmsnorm_fits",
    "apply_rope",
    "apply_rope_and_store",
    "cpu_linear",
    "decode_attention",
    "decode_rope_fits",
    "decode_splits",
    "fused_add_rmsnorm",
    "gather_page_indices",
    "gather_page_indices_ref",
    "gemv",
    "gemv_applies",
    "kernels_enabled",
    "linear",
    "linear_silu_and_mul",
    "rmsnorm",
    "rmsnorm_fits",
    "rope_and_store_fits",
    "rope_fits",
    "silu_and_mul",
    "silu_and_mul_fits",
    "store_kv",
    "store_kv_ref",
    "swap_in_kernels",
    "triton_available",
]
