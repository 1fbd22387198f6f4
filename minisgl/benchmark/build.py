"""The set-up every engine benchmark shares: build an `LLM` for a measurement, tell a config-only
model folder (random weights) from a checkpoint, wait for the GPU, and free an engine's memory so
that the next one (or a Hugging Face model) fits."""

from __future__ import annotations

import gc
from pathlib import Path

import torch

from minisgl.core import set_global_ctx
from minisgl.llm import LLM


def has_weights(model: str | Path) -> bool:
    """False for a folder with only a `config.json` (speed tests build random weights from it)."""
    return any(Path(model).glob("*.safetensors"))


def build_llm(model: str, *, dummy_weights: bool, max_running_reqs: int = 256, **options) -> LLM:
    """An `LLM` for a benchmark run (free it with `release`).

    Args:
        model: the model directory.
        dummy_weights: random weights from its config.json (no checkpoint needed).
        max_running_reqs: the largest batch; CUDA graphs are captured up to it (unless
            `cuda_graph_max_bs` is given), so no decode step of a measurement runs eagerly.
        options: any other `EngineConfig` or `SchedulerConfig` setting by name, the ones
            `python -m minisgl` takes as flags; what they leave out keeps the config's
            default, environment switches included.
    """
    options.setdefault("cuda_graph_max_bs", max_running_reqs)
    return LLM(model, dummy_weights=dummy_weights, max_running_reqs=max_running_reqs, **options)


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
