"""Triton kernels, each beside the plain PyTorch code it replaces, which stays its specification.

Each kernel entry point says which inputs it takes (its `*_fits` or `*_applies` check) and falls
back to the plain code for anything else; `util.use_triton` says whether a kernel runs at all
(Triton present, a GPU tensor or Triton's interpreter, kernels not switched off). The tests hold
every kernel to the code it replaces.
"""

from .activation import silu_and_mul, silu_and_mul_fits
from .cpu_gemm import cpu_linear
from .decode import DecodeScratch, DecodeTile, decode_attention, decode_rope_fits, decode_splits
from .gemv import GEMV_MAX_ROWS, PendingNorm, gemv, gemv_applies, linear, linear_silu_and_mul
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
    "PendingNorm",
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
