"""The set-up every engine benchmark shares: build an `LLM` from a few choices, tell a config-only
model folder (random weights) from a checkpoint, wait for the GPU, and free an engine's memory so
that the next one (or a Hugging Face model) fits."""

from __future__ import annotations

import gc
from pathlib import Path

import torch

from minisgl.core import set_global_ctx
from minisgl.engine import EngineConfig
from minisgl.llm import LLM
from minisgl.scheduler import SchedulerConfig


def has_weights(model: str | Path) -> bool:
    """False for a folder with only a `config.json` (speed tests build random weights from it)."""
    return any(Path(model).glob("*.safetensors"))


def build_llm(
    model: str,
    *,
    dummy_weights: bool,
    page_size: int = 1,
    max_running_reqs: int = 256,
    use_cuda_graph: bool = True,
    attention_backend: str = "auto",
    device: str = "auto",
    dtype: str = "auto",
    prefix_cache: str = "radix",
    **kw,
) -> LLM:
    """An `LLM` whose CUDA graphs cover every batch size up to `max_running_reqs`; `kw` goes to
    `EngineConfig`."""
    engine = EngineConfig(
        model_path=model,
        dummy_weights=dummy_weights,
        page_size=page_size,
        max_running_reqs=max_running_reqs,
        use_cuda_graph=use_cuda_graph,
        cuda_graph_max_bs=max_running_reqs,
        attention_backend=attention_backend,
        device=device,
        dtype=dtype,
        **kw,
    )
    return LLM(config=SchedulerConfig(engine=engine, prefix_cache=prefix_cache))


def release(llm: LLM) -> None:
    """Free an engine's GPU memory (KV pool, graphs) so another model can use it."""
    llm.shutdown()  # stops the other tensor-parallel ranks, if any
    set_global_ctx(None)
    del llm
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def sync(llm: LLM) -> None:
    """Wait for the engine's GPU work (nothing to wait for on the CPU)."""
    if llm.device.type == "cuda":
        torch.cuda.synchronize(llm.device)
