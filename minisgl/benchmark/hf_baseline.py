"""The baselines: Hugging Face transformers on the same requests, greedy, every request forced to
its `max_tokens` (end-of-sequence never stops one).

- `hf_generate`: `generate` on one left-padded batch (sdpa attention). It runs the batch until
  its longest request is done, so shorter requests keep producing tokens nobody asked for; only
  the requested tokens are counted, the same count the engine is measured by.
- `hf_continuous_batching`: transformers' own continuous batching (`init_continuous_batching`:
  a paged KV cache, requests join and leave the running batch), each request with its own
  `max_new_tokens`: the same kind of scheduling the engine does.
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
        return AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype,
                                                    attn_implementation="sdpa").to(device).eval()
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


def _finished(result) -> bool:
    if hasattr(result, "is_finished"):
        return result.is_finished()
    return getattr(result.status, "name", str(result.status)).upper() == "FINISHED"


@torch.inference_mode()
def hf_continuous_batching(model, prompts: Sequence[Sequence[int]], max_tokens: Sequence[int]) -> HFResult:
    """transformers' continuous batching on the requests; wall time from the first request added
    to the last one finished (the manager's start-up, which may capture graphs, is not timed)."""
    from transformers import GenerationConfig

    device = next(model.parameters()).device
    # eos_token_id -1: no token ends a request early (transformers' way of switching it off)
    config = GenerationConfig(max_new_tokens=max(max_tokens), do_sample=False, eos_token_id=-1, pad_token_id=0)
    manager = model.init_continuous_batching(generation_config=config)
    manager.start()
    results = {}
    try:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        ids = [f"req{i}" for i in range(len(prompts))]
        for rid, p, m in zip(ids, prompts, max_tokens):
            manager.add_request([int(t) for t in p], request_id=rid, max_new_tokens=m)
        while len(results) < len(ids):
            result = manager.get_result(timeout=1)
            if result is None:
                if not manager.is_running():
                    raise RuntimeError(f"transformers' continuous batching stopped with {len(ids) - len(results)} "
                                       "requests unfinished")
                continue
            if _finished(result):
                results[result.request_id] = result
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        seconds = time.perf_counter() - start
    finally:
        manager.stop(block=True)
    tokens = [list(results[rid].generated_tokens) for rid in ids]
    short = [(rid, len(t), m) for rid, t, m in zip(ids, tokens, max_tokens) if len(t) < m]
    if short:
        raise RuntimeError(f"transformers' continuous batching returned fewer tokens than asked for: {short[:3]}")
    return HFResult(seconds, sum(max_tokens), [t[:m] for t, m in zip(tokens, max_tokens)])
