from .config import ModelConfig
from .registry import create_model, register_model, supported_architectures
from .weight import load_checkpoint, load_dummy
from .qwen3_moe import MoeModelConfig, Qwen3MoeForCausalLM  # registers its architecture

__all__ = ["ModelConfig", "create_model", "register_model", "supported_architectures", "load_checkpoint", "load_dummy",
           "MoeModelConfig", "Qwen3MoeForCausalLM"]
