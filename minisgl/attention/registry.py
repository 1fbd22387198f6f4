"""Pick an attention backend by name ("auto": FlashInfer on CUDA when installed, part of the package
being run, and able to run the model's KV layout; else torch)."""

from __future__ import annotations

import importlib.util

import torch

from minisgl.kvcache.mha_pool import MHAKVCache
from minisgl.utils import package_has

from .base import BaseAttnBackend
from .torch_backend import TorchAttnBackend


FLASHINFER_HEAD_DIMS = (64, 128, 256)  # what its kernels are built for (merging split KV included)
FLASHINFER_DTYPES = (torch.float16, torch.bfloat16)
FLASHINFER_MODULE = "minisgl.attention.flashinfer_backend"  # arrives in chapter 17


def flashinfer_problem(device: torch.device, dtype: torch.dtype, head_dim: int) -> str | None:
    """Why FlashInfer cannot run this KV cache, or None if it can."""
    if device.type != "cuda":
        return "it needs the model on a CUDA device"
    if dtype not in FLASHINFER_DTYPES:
        return f"it runs in float16 or bfloat16, not {dtype}"
    if head_dim not in FLASHINFER_HEAD_DIMS:
        return f"it supports head_dim {', '.join(map(str, FLASHINFER_HEAD_DIMS))}, and this model's is {head_dim}"
    return None


def resolve_backend_name(name: str, device: torch.device, dtype: torch.dtype = torch.bfloat16, head_dim: int = 128) -> str:
    if name != "auto":
        return name
    # a staged package (the package as of an earlier chapter) lacks the FlashInfer backend: "auto"
    # chooses among what the package holds
    if (
        flashinfer_problem(device, dtype, head_dim) is None
        and importlib.util.find_spec("flashinfer") is not None
        and package_has(FLASHINFER_MODULE)
    ):
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
