"""Per-request sampling for a whole batch: greedy, temperature, top-k and top-p, seeded.

Random draws come from a counter-based hash of (seed, position, vocab id) instead of a
stateful generator, so a request's tokens do not depend on which other requests share its
batch, every tensor-parallel rank draws the same token, and the kernel sequence is fixed
(CUDA-graph friendly). Sampling itself is the exponential race: `argmax(p_i / E_i)` with
`E_i ~ Exp(1)` picks token i with probability p_i.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List

import torch

from minisgl.core import Req

_MASK32 = 0xFFFFFFFF


@dataclass
class BatchSamplingArgs:
    """Device tensors describing how each row of the logits is sampled. `None`: all greedy."""

    temperatures: torch.Tensor  # [bs] float32, 0 rows are greedy
    top_k: torch.Tensor  # [bs] int64, vocab size where off
    top_p: torch.Tensor  # [bs] float32
    seeds: torch.Tensor  # [bs] int64
    steps: torch.Tensor  # [bs] int64 position of the token being sampled
    use_top_k: bool
    use_top_p: bool


def make_sampling_args(reqs: List[Req], vocab_size: int, device: torch.device) -> BatchSamplingArgs | None:
    if all(r.sampling_params.is_greedy for r in reqs):
        return None
    temps, top_k, top_p, seeds, steps = [], [], [], [], []
    for r in reqs:
        sp = r.sampling_params
        temps.append(0.0 if sp.is_greedy else sp.temperature)
        top_k.append(vocab_size if sp.top_k < 0 else min(sp.top_k, vocab_size))
        top_p.append(sp.top_p)
        seeds.append(r.seed & 0x7FFFFFFF)
        steps.append(r.device_len)  # the position the sampled token will take
    return BatchSamplingArgs(
        temperatures=torch.tensor(temps, dtype=torch.float32).to(device, non_blocking=True),
        top_k=torch.tensor(top_k, dtype=torch.int64).to(device, non_blocking=True),
        top_p=torch.tensor(top_p, dtype=torch.float32).to(device, non_blocking=True),
        seeds=torch.tensor(seeds, dtype=torch.int64).to(device, non_blocking=True),
        steps=torch.tensor(steps, dtype=torch.int64).to(device, non_blocking=True),
        use_top_k=any(k < vocab_size for k in top_k),
        use_top_p=any(p < 1.0 for p in top_p),
    )


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer hash done in int64 without overflow (products stay below 2**59)."""
    for _ in range(2):
        x = x ^ (x >> 16)
        x = (x * 0x45D9F3B) & _MASK32
    return x ^ (x >> 16)


def hashed_uniform(seeds: torch.Tensor, steps: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """`[bs, vocab]` floats in (0, 1), a pure function of (seed, step, vocab id)."""
    idx = torch.arange(vocab_size, device=seeds.device, dtype=torch.int64)
    base = _mix32((_mix32(seeds & _MASK32) ^ (steps * 0x9E3779B1 & _MASK32)) & _MASK32)
    x = _mix32((base[:, None] + idx[None, :] * 0x85EBCA77) & _MASK32)
    return ((x >> 8).float() + 0.5) / float(1 << 24)


class Sampler:
    def __init__(self, vocab_size: int):
        self.vocab_size = vocab_size

    def sample(self, logits: torch.Tensor, args: BatchSamplingArgs | None) -> torch.Tensor:
        """logits: `[bs, vocab]` -> next token ids `[bs]` (int32)."""
        greedy = logits.argmax(dim=-1)
        if args is None:
            return greedy.to(torch.int32)
        logits = logits.float()
        temps = args.temperatures.clamp_min(1e-6)[:, None]
        probs = torch.softmax(logits / temps, dim=-1)
        if args.use_top_k or args.use_top_p:
            sorted_p, order = probs.sort(dim=-1, descending=True)
            ranks = torch.arange(self.vocab_size, device=logits.device)[None, :]
            drop = ranks >= args.top_k[:, None]
            # keep the smallest set whose mass reaches top_p (the first token always stays)
            drop |= (sorted_p.cumsum(dim=-1) - sorted_p) > args.top_p[:, None]
            sorted_p = sorted_p.masked_fill(drop, 0.0)
            probs = torch.zeros_like(probs).scatter_(1, order, sorted_p)
        race = probs / -torch.log(hashed_uniform(args.seeds, args.steps, self.vocab_size))
        sampled = race.argmax(dim=-1)
        return torch.where(args.temperatures == 0, greedy, sampled).to(torch.int32)
