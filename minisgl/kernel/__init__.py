"""Fused GPU kernels (Triton) for the hot paths of a forward pass, each with a PyTorch fallback.

Every public function here picks the Triton kernel when its inputs live on a CUDA device and
Triton imports, and otherwise runs the plain PyTorch version, which is also the reference the
tests compare the kernels against. The fallbacks compute exactly what the layers in
`minisgl.layers` compute, rounding step for rounding step.
"""

from .activation import silu_and_mul, silu_and_mul_ref
from .cpu_gemm import cpu_linear
from .decode import DecodeScratch, DecodeTile, decode_attention, decode_attention_ref, decode_splits
from .gemv import GEMV_MAX_ROWS, gemv, gemv_applies, linear, linear_silu_and_mul, linear_silu_and_mul_ref
from .index import gather_page_indices, gather_page_indices_ref
from .norm import fused_add_rmsnorm, fused_add_rmsnorm_ref, rmsnorm, rmsnorm_ref
from .rope import PendingRope, apply_rope, apply_rope_and_store, apply_rope_and_store_ref, apply_rope_ref
from .store import store_kv, store_kv_ref
from .util import triton_available

__all__ = [
    "DecodeScratch",
    "DecodeTile",
    "GEMV_MAX_ROWS",
    "PendingRope",
    "apply_rope",
    "apply_rope_and_store",
    "apply_rope_and_store_ref",
    "apply_rope_ref",
    "cpu_linear",
    "decode_attention",
    "decode_attention_ref",
    "decode_splits",
    "fused_add_rmsnorm",
    "fused_add_rmsnorm_ref",
    "gather_page_indices",
    "gather_page_indices_ref",
    "gemv",
    "gemv_applies",
    "linear",
    "linear_silu_and_mul",
    "linear_silu_and_mul_ref",
    "rmsnorm",
    "rmsnorm_ref",
    "silu_and_mul",
    "silu_and_mul_ref",
    "store_kv",
    "store_kv_ref",
    "triton_available",
]
