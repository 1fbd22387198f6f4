"""Everything an `Engine` is built from, validated once."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Union

import torch

from minisgl.env import ENV, default_model_path

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
DTYPE_NAMES = ("auto", *_DTYPES)


@dataclass(frozen=True)
class EngineConfig:
    """the model, its KV pool and its kernels, on one tensor-parallel rank"""

    model_path: str = field(default_factory=lambda: str(default_model_path()), metadata={
        "flag": "model", "help": "model directory (Hugging Face layout); default: $MINISGL_MODEL, else the bundled "
                                 "SmolLM2-135M-Instruct"})
    device: str = field(default="auto", metadata={"help": "auto (CUDA if present, else the CPU), cpu, cuda or cuda:N"})
    dtype: Union[str, torch.dtype] = field(default="auto", metadata={
        "choices": DTYPE_NAMES, "help": "weight and activation dtype (a torch.dtype is taken too); auto: bfloat16 on "
                                        "CUDA, float32 on the CPU"})
    page_size: int = field(default=1, metadata={"help": "tokens per KV page (a power of two)"})
    max_running_reqs: int = field(default=256, metadata={
        "aliases": ("max_running_req",), "help": "most requests decoding at once (rows of the page table)"})
    max_seq_len: Optional[int] = field(default=None, metadata={
        "aliases": ("max_seq_len_override",), "help": "context length cap; default: the model's"})
    num_pages: Optional[int] = field(default=None, metadata={
        "aliases": ("num_page_override",), "help": "KV pool size in pages; default: sized from the memory budget"})
    memory_fraction: float = field(default=0.9, metadata={
        "aliases": ("memory_ratio",), "help": "share of free GPU memory (after the weights) given to the KV pool"})
    cpu_kv_budget_gb: float = field(default_factory=lambda: ENV.cpu_kv_budget_gb, metadata={
        "help": "most GiB the KV pool takes on the CPU; default: $MINISGL_CPU_KV_BUDGET_GB, else 0.5"})
    attention_backend: str = field(default="auto", metadata={
        "help": "a backend's registered name, or auto: the fastest registered backend that runs here (torch, the "
                "reference, runs everywhere)"})
    dummy_weights: bool = field(default=False, metadata={
        "aliases": ("use_dummy_weight",), "help": "random weights from the model's config.json (for speed runs; the "
                                                  "text is noise)"})
    seed: int = field(default=0, metadata={"help": "seed for requests that give none"})
    tp_rank: int = field(default=0, metadata={"cli": False, "help": "this process's tensor-parallel rank (set by the "
                                                                    "launcher)"})
    tp_size: int = field(default=1, metadata={"help": "tensor-parallel ranks, one process (and GPU) each; the model's "
                                                      "heads must split evenly"})

    def __post_init__(self) -> None:
        if self.page_size < 1 or self.page_size & (self.page_size - 1):
            raise ValueError(f"page_size must be a power of two, got {self.page_size}")
        if self.tp_size < 1:
            raise ValueError(f"tp_size must be at least 1, got {self.tp_size}")
        if self.max_running_reqs < 1:
            raise ValueError(f"max_running_reqs must be >= 1, got {self.max_running_reqs}")
        if isinstance(self.dtype, torch.dtype):  # stored by name, so the config stays plain data
            names = {v: k for k, v in _DTYPES.items()}
            if self.dtype not in names:
                raise ValueError(f"dtype must be one of {', '.join(map(str, _DTYPES.values()))} or a name in "
                                 f"{', '.join(DTYPE_NAMES)}; got {self.dtype}")
            object.__setattr__(self, "dtype", names[self.dtype])
        if self.dtype not in DTYPE_NAMES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPE_NAMES)}; got {self.dtype!r}")
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
