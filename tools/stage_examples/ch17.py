"""Chapter 17: "auto" picks FlashInfer only on CUDA with FlashInfer installed; the CPU gets torch.
The package as of chapter 17 holds no triton-decode backend: asked for by name here, the registry says so."""

import torch

from minisgl.attention.registry import backend_names, create_attention_backend, resolve_backend_name
from minisgl.kvcache.mha_pool import MHAKVCache

assert resolve_backend_name("auto", torch.device("cpu")) == "torch"
assert resolve_backend_name("flashinfer", torch.device("cpu")) == "flashinfer"  # an explicit choice is kept
assert backend_names() == ("auto", "torch", "flashinfer")  # each backend module registers itself
kv = MHAKVCache(1, 4, 1, 1, 8, torch.float32, torch.device("cpu"))
try:
    create_attention_backend("triton-decode", kv, torch.zeros(2, 4, dtype=torch.int32))
    raise AssertionError("the package as of chapter 17 has no triton-decode backend")
except ValueError as e:
    assert "unknown attention backend 'triton-decode': this package holds auto, torch, flashinfer;" in str(e), e
print("cuda:", resolve_backend_name("auto", torch.device("cuda")))
