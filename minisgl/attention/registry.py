"""Pick an attention backend by name ("auto": FlashInfer on CUDA when installed, part of the package
being run, and able to run the model's KV layout; else torch)."""

from __future__ import annotations

import importlib.util

import torch

from minisgl.kvcache.mha_pool import MHAKVCache
from minisgl.utils import package_has

from .base import BaseAttnBackend
from .torch_backend import TorchAttnBackend


FLASHINFER_MODULE = "minisgl.attention.flashinfer_backend"  # arrives in chapter 17


def resolve_backend_name(name: str, device: torch.device, dtype: torch.dtype = torch.bfloat16, head_dim: int = 128) -> str:
    if name != "auto":
        return name
    # a staged package (the package as of an earlier chapter) lacks the FlashInfer backend: "auto"
    # chooses among what the package holds
    if package_has(FLASHINFER_MODULE) and importlib.util.find_spec("flashinfer") is not None:
        from .flashinfer_backend import flashinfer_problem  # the backend knows what its kernels run

        if flashinfer_problem(device, dtype, head_dim) is None:
            return "flashinfer"
    return "torch"  # the reference path runs everything, only slower


def create_attention_backend(name: str, kv_cache: MHAKVCache, page_table: torch.Tensor, **kwargs) -> BaseAttnBackend:
    name = resolve_backend_name(name, page_table.device, kv_cache.buffer.dtype, kv_cache.head_dim)
    if name == "torch":
        return TorchAttnBackend(kv_cache, page_table, kwargs.get("pad_slot", 0))
    if name == "flashinfer":
        if not package_has(FLASHINFER_MODULE):
            raise ValueError("attention_backend='flashinfer': this package has no FlashInfer backend yet "
                             "(chapter 17 adds it); use 'auto' or 'torch'")
        from .flashinfer_backend import FlashInferAttnBackend

        return FlashInferAttnBackend(kv_cache, page_table, **kwargs)
    raise ValueError(f"unknown attention backend {name!r}: choose 'auto', 'torch' or 'flashinfer'")
