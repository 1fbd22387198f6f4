"""Shared by the stage examples of chapters 7-11: transformers' greedy tokens for a prompt."""

import torch
from transformers import AutoModelForCausalLM

_HF = {}


def hf_greedy(path: str, ids: list[int], n: int) -> list[int]:
    if path not in _HF:
        _HF[path] = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    out = _HF[path].generate(torch.tensor([ids]), max_new_tokens=n, min_new_tokens=n, do_sample=False)
    return out[0, len(ids):].tolist()
