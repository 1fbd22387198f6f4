"""Everything an `Engine` is built from, validated once."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import torch

from minisgl.utils import default_model_path

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class EngineConfig:
    model_path: str = field(default_factory=lambda: str(default_model_path()))
    device: str = "auto"  # "auto" | "cpu" | "cuda" | "cuda:N"
    dtype: str = "auto"  # "auto": bfloat16 on CUDA, float32 on the CPU
    page_size: int = 1
    max_running_reqs: int = 256
    max_seq_len: Optional[int] = None  # default: the model's context length
    num_pages: Optional[int] = None  # default: sized from the memory budget
    memory_fraction: float = 0.9  # of free GPU memory (after weights) given to the KV pool
    cpu_kv_budget_gb: float = 1.0  # KV pool size on the CPU
    attention_backend: str = "auto"
    use_cuda_graph: bool = True
    cuda_graph_max_bs: int = 256
    dummy_weights: bool = False  # random weights (speed tests); needs only config.json
    seed: int = 0
    tp_rank: int = 0
    tp_size: int = 1

    def __post_init__(self) -> None:
        if self.page_size < 1 or self.page_size & (self.page_size - 1):
            raise ValueError(f"page_size must be a power of two, got {self.page_size}")
        if self.max_running_reqs < 1:
            raise ValueError(f"max_running_reqs must be >= 1, got {self.max_running_reqs}")
        if self.dtype not in ("auto", *_DTYPES):
            raise ValueError(f"dtype must be one of auto, {', '.join(_DTYPES)}; got {self.dtype!r}")
        if not Path(self.model_path).is_dir():
            raise FileNotFoundError(
                f"model directory {self.model_path} does not exist: run `make setup` (or "
                "`python tools/prepare_models.py`) for the bundled model, or pass a local checkpoint"
            )

    @property
    def torch_device(self) -> torch.device:
        if self.device == "auto":
            if torch.cuda.is_available():
                return torch.device("cuda", self.tp_rank)
            return torch.device("cpu")
        if self.device == "cuda":  # a bare "cuda" means this rank's own GPU
            return torch.device("cuda", self.tp_rank)
        return torch.device(self.device)

    @property
    def torch_dtype(self) -> torch.dtype:
        if self.dtype == "auto":
            return torch.bfloat16 if self.torch_device.type == "cuda" else torch.float32
        return _DTYPES[self.dtype]
