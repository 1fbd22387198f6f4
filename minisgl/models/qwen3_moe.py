"""Qwen3-MoE: the Qwen3 decoder with a sparse mixture-of-experts block in place of the MLP.

A router scores every expert per token; the token visits its top-k experts and mixes their
outputs with the (renormalised) router probabilities. Layers listed in `mlp_only_layers`, or
off the `decoder_sparse_step` grid, keep a dense MLP, as in the reference implementation.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields
from typing import Any, Dict, List, Optional, Tuple

import torch

from minisgl.distributed.split import register_split_widths
from minisgl.layers.base import BaseOP
from minisgl.layers.linear import LinearReplicated
from minisgl.moe import FusedMoE, select_experts

from .config import ModelConfig
from .llama import MLP, Qwen3ForCausalLM
from .registry import register_model

_EXPERT = re.compile(r"(.*\.mlp)\.experts\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")


@dataclass(frozen=True)
class MoeModelConfig(ModelConfig):
    """A `ModelConfig` with the experts' shape, read from the same `config.json` (0 experts: a dense model)."""

    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = True

    @classmethod
    def of(cls, cfg: ModelConfig) -> "MoeModelConfig":
        """`cfg` with the expert fields of the `config.json` it was read from."""
        if isinstance(cfg, cls):
            return cfg
        raw = cfg.raw
        return cls(**{f.name: getattr(cfg, f.name) for f in fields(ModelConfig)},
                   num_experts=raw.get("num_experts", 0) or 0,
                   num_experts_per_tok=raw.get("num_experts_per_tok", 0) or 0,
                   moe_intermediate_size=raw.get("moe_intermediate_size", 0) or 0,
                   norm_topk_prob=bool(raw.get("norm_topk_prob", True)))

    @classmethod
    def from_dict(cls, cfg: Dict[str, Any]) -> "MoeModelConfig":
        return cls.of(ModelConfig.from_dict(cfg))


class SparseMoeBlock(BaseOP):
    def __init__(self, cfg: MoeModelConfig, dtype: torch.dtype, device: torch.device):
        self.gate = LinearReplicated(cfg.hidden_size, cfg.num_experts, dtype=dtype, device=device)  # the router
        self.experts = FusedMoE(cfg.num_experts, cfg.hidden_size, cfg.moe_intermediate_size, dtype=dtype, device=device)
        self._top_k = cfg.num_experts_per_tok
        self._renormalize = cfg.norm_topk_prob

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, ids = select_experts(self.gate(x), self._top_k, self._renormalize)  # [tokens, top_k]
        return self.experts(x, weights, ids)


def is_sparse_layer(cfg: MoeModelConfig, layer_id: int) -> bool:
    step = cfg.raw.get("decoder_sparse_step", 1) or 1
    return cfg.num_experts > 0 and layer_id not in cfg.raw.get("mlp_only_layers", []) and (layer_id + 1) % step == 0


class Qwen3MoeForCausalLM(Qwen3ForCausalLM):
    def __init__(self, cfg: ModelConfig, dtype: torch.dtype, device: torch.device):
        cfg = MoeModelConfig.of(cfg)  # `self.config` then has the experts' shape too
        if cfg.num_experts_per_tok < 1 or cfg.num_experts_per_tok > cfg.num_experts:
            raise ValueError(f"num_experts_per_tok={cfg.num_experts_per_tok} must be in [1, "
                             f"num_experts={cfg.num_experts}]")

        def make_mlp(layer_id: int) -> BaseOP:
            return SparseMoeBlock(cfg, dtype, device) if is_sparse_layer(cfg, layer_id) else MLP(cfg, dtype, device)

        super().__init__(cfg, dtype, device, make_mlp)

    def place_checkpoint_tensor(self, params: Dict[str, torch.Tensor], name: str,
                                tensor: torch.Tensor) -> Optional[Tuple[str, Tuple[int, slice], torch.Tensor]]:
        """Loader hook: per-expert checkpoint matrices go into the stacked expert weights."""
        m = _EXPERT.match(name)
        if m is None:
            return None
        prefix, expert, proj = m.groups()
        layer = self.model.layers[int(prefix.split(".")[2])].mlp
        if not isinstance(layer, SparseMoeBlock):
            return None
        own, index, piece = layer.experts.place(int(expert), proj, tensor)
        return f"{prefix}.experts.{own}", index, piece


def moe_split_widths(cfg: ModelConfig) -> List[Tuple[str, int]]:
    """What tensor parallelism splits besides the heads: every expert's inner width, and the MLP's
    where some layer keeps a dense one."""
    moe = MoeModelConfig.of(cfg)
    widths = [("expert width", moe.moe_intermediate_size)] if moe.num_experts else []
    if not all(is_sparse_layer(moe, i) for i in range(moe.num_layers)):
        widths.insert(0, ("MLP width", moe.intermediate_size))
    return widths


register_model("Qwen3MoeForCausalLM", Qwen3MoeForCausalLM)
register_split_widths("Qwen3MoeForCausalLM", moe_split_widths)
