"""The model's shape, read from a Hugging Face `config.json`."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple


@dataclass(frozen=True)
class ModelConfig:
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool = False
    rope_scaling: Optional[Dict[str, Any]] = None
    eos_token_ids: Tuple[int, ...] = ()
    # all of config.json: a model class that needs more than these fields reads them from here
    raw: Dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def from_dict(cls, cfg: Dict[str, Any]) -> "ModelConfig":
        archs: List[str] = cfg.get("architectures") or []
        if not archs:
            raise ValueError("config.json names no architecture ('architectures' is missing)")
        heads = cfg["num_attention_heads"]
        rope = cfg.get("rope_parameters") or {}
        theta = cfg.get("rope_theta", rope.get("rope_theta", 10000.0))
        scaling = cfg.get("rope_scaling") or (rope if rope.get("rope_type", "default") != "default" else None)
        eos = cfg.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else ((eos,) if eos is not None else ())
        arch = archs[0]
        return cls(
            architecture=arch,
            vocab_size=cfg["vocab_size"],
            hidden_size=cfg["hidden_size"],
            intermediate_size=cfg.get("intermediate_size", 0),
            num_layers=cfg["num_hidden_layers"],
            num_heads=heads,
            num_kv_heads=cfg.get("num_key_value_heads") or heads,
            head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
            rope_theta=float(theta),
            max_position_embeddings=cfg.get("max_position_embeddings", 4096),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            attention_bias=bool(cfg.get("attention_bias", arch.startswith("Qwen2"))),
            rope_scaling=scaling,
            eos_token_ids=eos_ids,
            raw=cfg,
        )

    @classmethod
    def from_dir(cls, model_dir: str | Path) -> "ModelConfig":
        path = Path(model_dir) / "config.json"
        if not path.exists():
            raise FileNotFoundError(
                f"{path} not found: point --model at a Hugging Face model directory "
                "(run `python tools/prepare_models.py` to build the bundled ones)"
            )
        config = cls.from_dict(json.loads(path.read_text()))
        gen = Path(model_dir) / "generation_config.json"
        if gen.exists():
            eos = json.loads(gen.read_text()).get("eos_token_id")
            extra = tuple(eos) if isinstance(eos, list) else ((eos,) if eos is not None else ())
            merged = tuple(dict.fromkeys(config.eos_token_ids + extra))
            config = cls(**{**config.__dict__, "eos_token_ids": merged})
        return config
