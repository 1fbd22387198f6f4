"""Stream a safetensors checkpoint into a model, one tensor at a time.

The checkpoint names q/k/v and gate/up separately; our model stores them merged, and under
tensor parallelism each rank keeps only its slice. Each checkpoint tensor is read, cut and
copied straight into its place, so peak memory is the model plus one tensor.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Tuple

import torch
from safetensors import safe_open

from minisgl.distributed.info import get_tp_info
from minisgl.layers.linear import LinearQKVMerged

from .llama import CausalLM
from .registry import supported_architectures

_MERGED = {"q_proj": ("qkv_proj", 0), "k_proj": ("qkv_proj", 1), "v_proj": ("qkv_proj", 2),
           "gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1)}
_ROW_PARALLEL = ("o_proj.weight", "down_proj.weight")
_VOCAB = ("embed_tokens.weight", "lm_head.weight")


def iter_checkpoint(model_dir: str | Path) -> Iterator[Tuple[str, torch.Tensor]]:
    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors files in {model_dir}: put the checkpoint there, or run with "
                                "random weights of this shape (--dummy-weights, LLM(..., dummy_weights=True))")
    for f in files:
        with safe_open(str(f), framework="pt") as reader:
            for name in reader.keys():
                yield name, reader.get_tensor(name)


def _qkv_part(layer: LinearQKVMerged, part: int, t: torch.Tensor) -> Tuple[slice, torch.Tensor]:
    """Rows of the merged QKV weight that checkpoint part `part` (0=q, 1=k, 2=v) fills on this rank."""
    rank, d = get_tp_info().rank, layer.head_dim
    nq, nkv = layer.num_q_heads, layer.num_kv_heads
    if part == 0:
        return slice(0, nq * d), t[rank * nq * d : (rank + 1) * nq * d]
    start = layer.kv_head_start(rank)
    offset = nq * d + (part - 1) * nkv * d
    return slice(offset, offset + nkv * d), t[start * d : (start + nkv) * d]


def _shard_rows(t: torch.Tensor, parts: int, rank: int, pad_to: Optional[int] = None) -> torch.Tensor:
    size = pad_to if pad_to is not None else t.shape[0] // parts
    piece = t[rank * size : (rank + 1) * size]
    if len(piece) < size:  # the last vocabulary shard is padded with zeros
        piece = torch.cat([piece, piece.new_zeros(size - len(piece), *piece.shape[1:])])
    return piece


def _find(model: CausalLM, dotted: str):
    obj = model
    for part in dotted.split("."):
        obj = obj[int(part)] if part.isdigit() else getattr(obj, part)
    return obj


def load_checkpoint(model: CausalLM, model_dir: str | Path) -> None:
    """Fill every weight of `model` from `model_dir`; raise if any weight is left unfilled."""
    params = model.state_dict()
    tp = get_tp_info()
    filled: Dict[str, int] = {}
    for name, tensor in iter_checkpoint(model_dir):
        if name == "lm_head.weight" and model.config.tie_word_embeddings:
            continue
        if "rotary_emb" in name:
            continue
        target_name, rows, piece = _place(model, params, name, tensor, tp)
        if target_name is None:
            raise KeyError(f"checkpoint tensor {name!r} has no place in {type(model).__name__}: the checkpoint has "
                           "weights this model class does not declare. Build the model with `create_model`, which "
                           f"picks the class registered for config.json's architecture ({model.config.architecture!r}; "
                           f"registered: {', '.join(supported_architectures())}), and check that config.json names "
                           "the architecture the checkpoint was saved from")
        target = params[target_name][rows] if rows is not None else params[target_name]
        if target.shape != piece.shape:
            raise ValueError(f"{name}: expected shape {tuple(target.shape)} here, checkpoint slice has "
                             f"{tuple(piece.shape)}")
        target.copy_(piece.to(target.dtype))
        filled[target_name] = filled.get(target_name, 0) + piece.numel()
    missing = [n for n, p in params.items() if filled.get(n, 0) != p.numel()]
    if missing:
        raise KeyError(f"weights not (fully) filled from {model_dir}: "
                       f"{missing[:5]}{' ...' if len(missing) > 5 else ''}")


def _place(model: CausalLM, params, name: str, tensor: torch.Tensor, tp) -> Tuple[Optional[str], Optional[slice],
                                                                                  torch.Tensor]:
    """Where a checkpoint tensor goes: (parameter name, row slice or None, the tensor slice)."""
    hook = getattr(model, "place_checkpoint_tensor", None)  # models with their own layouts of some tensors
    placed = hook(params, name, tensor) if hook is not None else None
    if placed is not None:
        return placed
    m = re.match(r"(.*)\.(q_proj|k_proj|v_proj|gate_proj|up_proj)\.(weight|bias)$", name)
    if m:
        prefix, proj, kind = m.groups()
        merged, part = _MERGED[proj]
        target = f"{prefix}.{merged}.{kind}"
        if target not in params:
            return None, None, tensor
        layer = _find(model, f"{prefix}.{merged}")
        if merged == "qkv_proj":
            rows, piece = _qkv_part(layer, part, tensor)
            return target, rows, piece
        size = layer.local_sizes[part]
        start = sum(layer.local_sizes[:part])
        return target, slice(start, start + size), _shard_rows(tensor, tp.size, tp.rank)
    if name.endswith(_ROW_PARALLEL):
        return (name if name in params else None), None, tensor.chunk(tp.size,
                                                                      dim=1)[tp.rank] if tp.size > 1 else tensor
    if name.endswith(_VOCAB):
        if name not in params:
            return None, None, tensor
        return name, None, _shard_rows(tensor, tp.size, tp.rank,
                                       pad_to=params[name].shape[0]) if tp.size > 1 else tensor
    return (name if name in params else None), None, tensor


def load_dummy(model: CausalLM, seed: int = 0) -> None:
    """Random weights for speed measurements: cost does not depend on values. Norms start at one."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    for name, p in model.state_dict().items():
        if name.endswith("norm.weight"):
            p.fill_(1.0)
        else:
            p.copy_((torch.randn(p.shape, generator=gen) * 0.02).to(p.dtype))


def checkpoint_names(model_dir: str | Path) -> List[str]:
    return [n for n, _ in iter_checkpoint(model_dir)]
