"""Architecture name (from `config.json`) -> model class."""

from __future__ import annotations

from typing import Callable, Dict

import torch

from .config import ModelConfig
from .llama import CausalLM, LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM

_REGISTRY: Dict[str, Callable[..., CausalLM]] = {
    "LlamaForCausalLM": LlamaForCausalLM,
    "MistralForCausalLM": LlamaForCausalLM,
    "Qwen2ForCausalLM": Qwen2ForCausalLM,
    "Qwen3ForCausalLM": Qwen3ForCausalLM,
}  # other model modules add theirs with `register_model` when imported


def register_model(architecture: str, factory: Callable[..., CausalLM]) -> None:
    _REGISTRY[architecture] = factory


def supported_architectures() -> list[str]:
    return sorted(_REGISTRY)


def create_model(cfg: ModelConfig, dtype: torch.dtype, device: torch.device) -> CausalLM:
    factory = _REGISTRY.get(cfg.architecture)
    if factory is None:
        raise ValueError(
            f"architecture {cfg.architecture!r} is not supported; supported: {', '.join(supported_architectures())}"
        )
    return factory(cfg, dtype, device)
