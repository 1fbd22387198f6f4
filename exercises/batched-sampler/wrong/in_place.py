"""Wrong: divides the caller's logits by the temperature in place."""

from typing import Optional

import torch

from minisgl.engine.sample import BatchSamplingArgs, hashed_uniform
from minisgl.engine.sample import Sampler as EngineSampler


class Sampler(EngineSampler):
    def sample(self, logits: torch.Tensor, args: Optional[BatchSamplingArgs]) -> torch.Tensor:
        greedy = logits.argmax(dim=-1)
        if args is None:
            return greedy.to(torch.int32)
        temps = args.temperatures.clamp_min(1e-6)[:, None]
        logits.div_(temps)
        probs = torch.softmax(logits.float(), dim=-1)
        if args.use_top_k or args.use_top_p:
            sorted_p, order = probs.sort(dim=-1, descending=True)
            ranks = torch.arange(self.vocab_size, device=logits.device)[None, :]
            drop = ranks >= args.top_k[:, None]
            # keep the smallest set whose mass reaches top_p (the first token always stays)
            drop |= (sorted_p.cumsum(dim=-1) - sorted_p) > args.top_p[:, None]
            sorted_p = sorted_p.masked_fill(drop, 0.0)
            probs = torch.zeros_like(probs).scatter_(1, order, sorted_p)
        # the exponential race: argmax(p / E) with E ~ Exp(1) picks token i with probability p_i
        race = probs / -torch.log(hashed_uniform(args.seeds, args.steps, self.vocab_size))
        sampled = race.argmax(dim=-1)
        return torch.where(args.temperatures == 0, greedy, sampled).to(torch.int32)
