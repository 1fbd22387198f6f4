"""Exercise batched-sampler (chapter 6): sample a whole batch, each row with its own settings.

Write `Sampler.sample`. `BatchSamplingArgs`, `make_sampling_args` and the counter-based random
numbers `hashed_uniform` are the engine's. Grade with `python judge.py batched-sampler`.
"""

from typing import Optional

import torch

from minisgl.engine.sample import BatchSamplingArgs, hashed_uniform
from minisgl.engine.sample import Sampler as EngineSampler


class Sampler(EngineSampler):
    def sample(self, logits: torch.Tensor, args: Optional[BatchSamplingArgs]) -> torch.Tensor:
        """logits `[bs, vocab]` -> next token ids `[bs]` (int32). `args is None`: all greedy.
        Do not modify `logits`."""
        raise NotImplementedError("batched-sampler: write Sampler.sample")
