from .align import AlignedRows, moe_align_block_size, moe_align_block_size_ref
from .layer import FusedMoE, resolve_moe_backend
from .router import select_experts
from .torch_moe import moe_forward_torch

__all__ = [
    "AlignedRows",
    "FusedMoE",
    "moe_align_block_size",
    "moe_align_block_size_ref",
    "moe_forward_torch",
    "resolve_moe_backend",
    "select_experts",
]
