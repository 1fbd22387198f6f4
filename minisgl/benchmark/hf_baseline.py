"""The baseline: Hugging Face `generate` on the same requests (sdpa attention, one left-padded
batch, greedy, every request forced to its `max_tokens`).

`generate` runs the batch until its longest request is done, so shorter requests keep
producing tokens nobody asked for; only the requested tokens are counted, the same count the
engine is measured by.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import List, Sequence

import torch


@dataclass
class HFResult:
    seconds: float
    output_tokens: int  # requested tokens (sum of max_tokens), the throughput numerator
    token_ids: List[List[int]]  # each request's first max_tokens generated ids

    @property
    def tokens_per_s(self) -> float:
        return self.output_tokens / self.seconds


def build_hf_model(model_path: str, dtype: torch.dtype, device: torch.device, dummy_weights: bool, seed: int = 0):
    from transformers import AutoConfig, AutoModelForCausalLM

    if not dummy_weights:
        return AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype, attn_implementation="sdpa").to(device).eval()
    config = AutoConfig.from_pretrained(model_path)
    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation="sdpa")
    return model.eval()


@torch.inference_mode()
def hf_generate(model, prompts: Sequence[Sequence[int]], max_tokens: Sequence[int], pad_id: int = 0) -> HFResult:
    """Greedy `generate` on one left-padded batch; returns wall time and each request's tokens."""
    device = next(model.parameters()).device
    longest = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), longest), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), longest), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, longest - len(p) :] = torch.tensor(p)
        mask[i, longest - len(p) :] = 1
    ids, mask = ids.to(device), mask.to(device)
    steps = max(max_tokens)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    out = model.generate(
        input_ids=ids,
        attention_mask=mask,
        max_new_tokens=steps,
        min_new_tokens=steps,  # like ignore_eos: end-of-sequence is never sampled
        do_sample=False,
        pad_token_id=pad_id,
    )
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - start
    new = out[:, longest:].tolist()
    return HFResult(seconds, sum(max_tokens), [row[:n] for row, n in zip(new, max_tokens)])
