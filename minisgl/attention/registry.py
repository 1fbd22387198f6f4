"""Pick an attention backend by name ("auto": FlashInfer on CUDA when installed, else torch)."""

from __future__ import annotations

import importlib.util

import torch

from minisgl.kvcache.mha_pool import MHAKVCache

from .base import BaseAttnBackend
from .torch_backend import TorchAttnBackend


def resolve_backend_name(name: str, device: torch.device) -> str:
    if name != "auto":
        return name
    if device.type == "cuda" and importlib.util.find_spec("flashinfer") is not None:
        return "flashinfer"
    return "torch"


def create_attention_backend(name: str, kv_cache: MHAKVCache, page_table: torch.Tensor, **kwargs) -> BaseAttnBackend:
    name = resolve_backend_name(name, page_table.device)
    if name == "torch":
        return TorchAttnBackend(kv_cache, page_table, kwargs.get("pad_slot", 0))
    if name == "flashinfer":
        from .flashinfer_backend import FlashInferAttnBackend

        return FlashInferAttnBackend(kv_cache, page_table, **kwargs)
    raise ValueError(f"unknown attention backend {name!r}: choose 'auto', 'torch' or 'flashinfer'")
