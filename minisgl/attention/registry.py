"""Pick an attention backend by name.

"auto" takes the fastest one the package and the machine can run: on CUDA with FlashInfer installed,
the Triton-decode backend where the package has it, else FlashInfer; else torch, the reference
path that runs everything. The GPU backends are optional modules, imported only when chosen.
"""

from __future__ import annotations

import importlib.util

import torch

from minisgl.kvcache.mha_pool import MHAKVCache
from minisgl.utils import package_has

from .base import BaseAttnBackend
from .torch_backend import TorchAttnBackend

FLASHINFER_MODULE = "minisgl.attention.flashinfer_backend"
TRITON_DECODE_MODULE = "minisgl.attention.triton_decode_backend"
BACKENDS = ("auto", "torch", "flashinfer", "triton-decode")


def resolve_backend_name(name: str, device: torch.device, dtype: torch.dtype = torch.bfloat16,
                         head_dim: int = 128) -> str:
    if name != "auto":
        return name
    # "auto" chooses among the backends this package holds
    if package_has(FLASHINFER_MODULE) and importlib.util.find_spec("flashinfer") is not None:
        from .flashinfer_backend import flashinfer_problem  # the backend knows what its kernels run

        if flashinfer_problem(device, dtype, head_dim) is None:
            return "triton-decode" if package_has(TRITON_DECODE_MODULE) else "flashinfer"
    return "torch"


def create_attention_backend(name: str, kv_cache: MHAKVCache, page_table: torch.Tensor, **kwargs) -> BaseAttnBackend:
    name = resolve_backend_name(name, page_table.device, kv_cache.buffer.dtype, kv_cache.head_dim)
    if name == "torch":
        return TorchAttnBackend(kv_cache, page_table, kwargs.get("pad_slot", 0))
    if name not in BACKENDS:
        raise ValueError(f"unknown attention backend {name!r}: choose one of {', '.join(BACKENDS)}")
    module = FLASHINFER_MODULE if name == "flashinfer" else TRITON_DECODE_MODULE
    if not package_has(module):
        raise ValueError(f"attention_backend={name!r}: this package holds no {module}; use 'auto' or 'torch'")
    if name == "flashinfer":
        from .flashinfer_backend import FlashInferAttnBackend

        return FlashInferAttnBackend(kv_cache, page_table, **kwargs)
    from .triton_decode_backend import TritonDecodeAttnBackend

    return TritonDecodeAttnBackend(kv_cache, page_table, **kwargs)
