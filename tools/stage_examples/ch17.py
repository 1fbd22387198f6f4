"""Chapter 17: "auto" picks FlashInfer only on CUDA with FlashInfer installed; the CPU gets torch."""

import torch

from minisgl.attention.registry import resolve_backend_name

assert resolve_backend_name("auto", torch.device("cpu")) == "torch"
assert resolve_backend_name("flashinfer", torch.device("cpu")) == "flashinfer"  # an explicit choice is kept
print("cuda:", resolve_backend_name("auto", torch.device("cuda")))
