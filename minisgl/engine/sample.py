"""Per-request sampling for a whole batch: greedy, temperature, top-k and top-p, seeded.

Random draws come from a counter-based hash of (seed, position, vocab id) instead of a
stateful generator, so a request's tokens do not depend on which other requests share its
batch, every tensor-parallel rank draws the same token, and the kernel sequence is the same
at every step. Sampling itself is the exponential race: `argmax(p_i / E_i)` with
`E_i ~ Exp(1)` picks token i with probability p_i.

Around the draw, `Sampler.run` first lets the logits processors (`processors.py`: penalties,
biases, masks, min_p) change the logits, and afterwards runs the after-sampling reports the plan
names: what a later module computes from the model's logits and the drawn tokens, registered with
`after_sampling`. Every step is a handful of batched tensor operations, whatever the mix of settings.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, List, Optional

import torch

from minisgl.core import Req

from .processors import LogitsArgs, apply_min_p, make_logits_args, process_logits

_MASK32 = 0xFFFFFFFF


@dataclass
class BatchSamplingArgs:
    """Device tensors describing how each row of the logits is sampled. `None`: all greedy."""

    temperatures: torch.Tensor  # [bs] float32, 0 rows are greedy
    top_k: torch.Tensor  # [bs] int64, vocab size where off
    top_p: torch.Tensor  # [bs] float32
    seeds: torch.Tensor  # [bs] int64: the 64-bit seed, two's complement
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
        seeds.append(r.seed - (1 << 64) if r.seed >= 1 << 63 else r.seed)  # as int64, all 64 bits kept
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


def make_sampling_plan(
    reqs: List[Req], vocab_size: int, device: torch.device, history: torch.Tensor, eos_ids: Iterable[int],
    bitmask: Optional[torch.Tensor] = None
) -> Optional[SamplingPlan]:
    """What the sampler does to this batch (None: plain greedy). `history` is the token pool the
    penalties count from; `bitmask` the allowed tokens per row (host, `[bs, words]` int32) or None."""
    sampling = make_sampling_args(reqs, vocab_size, device)
    logits = make_logits_args(reqs, device, history, eos_ids, bitmask)
    if sampling is None and logits is None:
        return None
    return SamplingPlan(sampling, logits)


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer hash done in int64 without overflow (products stay below 2**59)."""
    for _ in range(2):
        x = x ^ (x >> 16)
        x = (x * 0x45D9F3B) & _MASK32
    return x ^ (x >> 16)


def hashed_uniform(seeds: torch.Tensor, steps: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """`[bs, vocab]` floats in (0, 1), a pure function of (seed, step, vocab id).

    The seed's low 32 bits drive one hash lane; its high 32 bits drive a second one, xor-ed in
    where they are not zero (so seeds below 2**32 keep the streams they always had)."""
    idx = torch.arange(vocab_size, device=seeds.device, dtype=torch.int64)
    lo, hi = seeds & _MASK32, (seeds >> 32) & _MASK32
    base = _mix32((_mix32(lo) ^ (steps * 0x9E3779B1 & _MASK32)) & _MASK32)
    x = _mix32((base[:, None] + idx[None, :] * 0x85EBCA77) & _MASK32)
    base_hi = _mix32((_mix32(hi) ^ (steps * 0x27D4EB2F & _MASK32)) & _MASK32)
    x_hi = _mix32((base_hi[:, None] + idx[None, :] * 0xC2B2AE3D) & _MASK32)
    x = x ^ torch.where(hi[:, None] != 0, x_hi, 0)
    # float32 rounds the top value, (2**24 - 0.5) / 2**24, up to 1.0, whose -log is 0: the race
    # would divide by zero, and 0 / 0 (a token masked to probability 0) would win the argmax
    return (((x >> 8).float() + 0.5) / float(1 << 24)).clamp_max(1.0 - 2.0**-24)


@dataclass
class SamplingPlan:
    """Everything the sampler does to one batch's logits. `None` in place of a plan: greedy only."""

    sampling: Optional[BatchSamplingArgs]  # the draw; None: every row is greedy
    logits: Optional[LogitsArgs] = None  # penalties, biases and masks; None: logits used as they are
    # after-sampling reports this batch asks for: registered name -> its argument (set by the scheduler)
    reports: Dict[str, Any] = field(default_factory=dict)


@dataclass
class SamplerOutput:
    """One batch's sampled tokens and the after-sampling reports its plan asked for, by name."""

    tokens: torch.Tensor  # [bs] int32
    reports: Dict[str, Any] = field(default_factory=dict)


# fn(logits, tokens, argument) -> the report: `logits` the model's own `[bs, vocab]` (before any
# processor), `tokens` the drawn `[bs]` int32, `argument` what the plan put under the report's name
AfterSampling = Callable[[torch.Tensor, torch.Tensor, Any], Any]
_AFTER_SAMPLING: Dict[str, AfterSampling] = {}


def after_sampling(name: str) -> Callable[[AfterSampling], AfterSampling]:
    """Decorator: register a report `Sampler.run` computes after the draw for a plan whose `reports`
    names it (its result goes to `SamplerOutput.reports[name]`). Registering a name again replaces it."""
    def register(fn: AfterSampling) -> AfterSampling:
        _AFTER_SAMPLING[name] = fn
        return fn
    return register


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
            sorted_p = sorted_p.masked_fill(drop, 0.0)
            # top-p reads the distribution top-k left, renormalised (as transformers' warpers do):
            # keep the smallest set reaching top_p of the kept mass (the first token always stays)
            kept_mass = sorted_p.sum(dim=-1, keepdim=True)
            drop = (sorted_p.cumsum(dim=-1) - sorted_p) > args.top_p[:, None] * kept_mass
            sorted_p = sorted_p.masked_fill(drop, 0.0)
            probs = torch.zeros_like(probs).scatter_(1, order, sorted_p)
        race = probs / -torch.log(hashed_uniform(args.seeds, args.steps, self.vocab_size))
        sampled = race.argmax(dim=-1)
        return torch.where(args.temperatures == 0, greedy, sampled).to(torch.int32)

    def run(self, logits: torch.Tensor, plan: Optional[SamplingPlan]) -> SamplerOutput:
        """Process the logits, draw one token per row and run the reports the plan names.
        logits: `[bs, vocab]` (left unchanged)."""
        if plan is None:
            return SamplerOutput(self.sample(logits, None))
        processed = logits
        if plan.logits is not None:
            processed = process_logits(logits, plan.logits)
            if plan.logits.min_p is not None and plan.sampling is not None:
                processed = apply_min_p(processed, plan.sampling.temperatures, plan.logits.min_p)
        out = SamplerOutput(self.sample(processed, plan.sampling))
        for name, arg in plan.reports.items():
            if name not in _AFTER_SAMPLING:
                raise LookupError(f"the sampling plan asks for the report {name!r}, which no module registered: import "
                               f"the module that declares it (`after_sampling`), or drop it from the plan")
            out.reports[name] = _AFTER_SAMPLING[name](logits, out.tokens, arg)
        return out
