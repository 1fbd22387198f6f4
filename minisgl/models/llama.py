"""The Llama family decoder (Llama, Mistral, Qwen2, Qwen3): one implementation, a few switches.

Qwen2 adds a bias to the QKV projection; Qwen3 normalises each query and key head (qk-norm).
Weights are named exactly as in the checkpoints so the loader can match them by name.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch

from minisgl.core import get_global_ctx
from minisgl.layers.base import BaseOP, OPList
from minisgl.layers.embedding import ParallelLMHead, VocabParallelEmbedding
from minisgl.layers.linear import LinearColParallelMerged, LinearQKVMerged, LinearRowParallel
from minisgl.layers.norm import RMSNorm
from minisgl.layers.rotary import QKNormRope, RotaryEmbedding

from .config import ModelConfig


class Attention(BaseOP):
    def __init__(self, cfg: ModelConfig, layer_id: int, rotary: RotaryEmbedding, qk_norm: bool, dtype, device):
        self.layer_id = layer_id
        self.qkv_proj = LinearQKVMerged(
            cfg.hidden_size, cfg.head_dim, cfg.num_heads, cfg.num_kv_heads, bias=cfg.attention_bias, dtype=dtype,
            device=device
        )
        self.o_proj = LinearRowParallel(cfg.num_heads * cfg.head_dim, cfg.hidden_size, dtype=dtype, device=device)
        if qk_norm:
            self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps, dtype=dtype, device=device)
            self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps, dtype=dtype, device=device)
        self._qk = QKNormRope(rotary, getattr(self, "q_norm", None), getattr(self, "k_norm", None))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ctx = get_global_ctx()
        p, d = self.qkv_proj, self.qkv_proj.head_dim
        q, k, v = self.qkv_proj(x).split([p.num_q_heads * d, p.num_kv_heads * d, p.num_kv_heads * d], dim=-1)
        q = q.view(-1, p.num_q_heads, d)  # [tokens, heads, head_dim]
        k = k.view(-1, p.num_kv_heads, d)
        v = v.view(-1, p.num_kv_heads, d)
        # the backend applies the qk-norm and RoPE (`self._qk`), stores k and v in the pool, and attends
        o = ctx.attn_backend.forward(q, k, v, self.layer_id, ctx.batch, self._qk)
        return self.o_proj(o.reshape(len(x), -1))


class MLP(BaseOP):
    def __init__(self, cfg: ModelConfig, dtype, device):
        self.gate_up_proj = LinearColParallelMerged(cfg.hidden_size, [cfg.intermediate_size] * 2, dtype=dtype,
                                                    device=device)
        self.down_proj = LinearRowParallel(cfg.intermediate_size, cfg.hidden_size, dtype=dtype, device=device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # silu(x @ gate.T) * (x @ up.T), then down
        return self.down_proj(self.gate_up_proj.forward_silu_and_mul(x))


class DecoderLayer(BaseOP):
    def __init__(self, cfg: ModelConfig, layer_id: int, rotary: RotaryEmbedding, qk_norm: bool, dtype, device,
                 mlp: Optional[BaseOP] = None):
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype=dtype, device=device)
        self.self_attn = Attention(cfg, layer_id, rotary, qk_norm, dtype, device)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype=dtype, device=device)
        self.mlp = mlp if mlp is not None else MLP(cfg, dtype, device)

    def forward(self, x: torch.Tensor, residual: Optional[torch.Tensor]) -> Tuple[torch.Tensor, torch.Tensor]:
        # pre-norm: each block reads norm(x + residual), and x + residual is the new residual stream
        h, residual = self.input_layernorm.forward_residual(x, residual)
        h = self.self_attn(h)
        h, residual = self.post_attention_layernorm.forward_residual(h, residual)
        return self.mlp(h), residual


class DecoderModel(BaseOP):
    def __init__(self, cfg: ModelConfig, qk_norm: bool, dtype, device, make_mlp=None):
        rotary = RotaryEmbedding(cfg.head_dim, cfg.max_position_embeddings, cfg.rope_theta, cfg.rope_scaling, device)
        self.embed_tokens = VocabParallelEmbedding(cfg.vocab_size, cfg.hidden_size, dtype=dtype, device=device)
        self.layers = OPList(
            [DecoderLayer(cfg, i, rotary, qk_norm, dtype, device,
                          make_mlp(i) if make_mlp else None) for i in range(cfg.num_layers)]
        )
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype=dtype, device=device)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x, residual = self.embed_tokens(input_ids), None
        for layer in self.layers:
            x, residual = layer(x, residual)
        return self.norm.forward_residual(x, residual)[0]


class CausalLM(BaseOP):
    """Decoder plus LM head; `forward()` reads the batch from the global context and returns
    logits `[batch_size, vocab]` for each request's last position."""

    qk_norm = False

    def __init__(self, cfg: ModelConfig, dtype: torch.dtype, device: torch.device, make_mlp=None):
        self.config = cfg
        self.model = DecoderModel(cfg, self.qk_norm, dtype, device, make_mlp)
        tie = self.model.embed_tokens if cfg.tie_word_embeddings else None
        self.lm_head = ParallelLMHead(cfg.vocab_size, cfg.hidden_size, tie_to=tie, dtype=dtype, device=device)

    def forward(self) -> torch.Tensor:
        batch = get_global_ctx().batch
        hidden = self.model(batch.input_ids)
        if batch.is_prefill:
            hidden = hidden[batch.last_indices]
        return self.lm_head(hidden)


class LlamaForCausalLM(CausalLM):
    pass


class Qwen2ForCausalLM(CausalLM):
    pass


class Qwen3ForCausalLM(CausalLM):
    qk_norm = True
