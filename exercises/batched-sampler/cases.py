"""Cases for batched-sampler: sampled ids for random logits and mixed settings; engine runs."""

import random

import torch

from judge import harness
from judge.api import E2E, Obs, case, snapshot
from minisgl.core import Req, SamplingParams
from minisgl.engine.sample import Sampler, make_sampling_args
from minisgl.kvcache import BaseCacheHandle

VOCAB = 512


def _sample(obs: Obs, params, seed: int, steps: int = 3) -> None:
    gen = torch.Generator().manual_seed(seed)
    sampler = Sampler(VOCAB)
    reqs = [Req(torch.arange(4, dtype=torch.int32), i, 0, i, sp, BaseCacheHandle(0), seed=1000 + 7 * i + seed) for i, sp in enumerate(params)]
    for step in range(steps):
        logits = (torch.randn(len(reqs), VOCAB, generator=gen) * 3).to(harness.device())
        args = make_sampling_args(reqs, VOCAB, harness.device())
        before = snapshot(logits)
        ids = sampler.sample(logits, args)
        obs.unchanged(f"step {step}: the logits you were given", before, logits)
        obs.eq(f"step {step}: dtype and shape of the result", [str(ids.dtype), list(ids.shape)])
        for i, t in enumerate(ids.tolist()):
            obs.eq(f"step {step}, request {i} ({_describe(params[i])}): sampled id", t)
        for r in reqs:
            r.device_len += 1  # the next position: fresh random numbers


def _describe(sp: SamplingParams) -> str:
    if sp.is_greedy:
        return "greedy"
    return f"temperature {sp.temperature}, top_k {sp.top_k}, top_p {sp.top_p}"


@case("all greedy", hint=1)
def greedy(obs: Obs) -> None:
    _sample(obs, [SamplingParams()] * 3, 0)


@case("temperature only, mixed with greedy rows", hint=2)
def temperature(obs: Obs) -> None:
    _sample(obs, [SamplingParams(temperature=0.7), SamplingParams(), SamplingParams(temperature=1.5)], 1)


@case("top-k and top-p", hint=3)
def topk_topp(obs: Obs) -> None:
    _sample(obs, [SamplingParams(temperature=1.0, top_k=5), SamplingParams(temperature=1.0, top_p=0.3), SamplingParams(temperature=0.9, top_k=20, top_p=0.5),
                  SamplingParams(temperature=1.0, top_p=0.0001), SamplingParams(temperature=1.0, top_k=3, top_p=0.6),
                  SamplingParams(temperature=1.2, top_k=8, top_p=0.5)], 2, steps=4)


@case("random batches of settings", seeds=4, hint=3)
def random_settings(obs: Obs, seed: int) -> None:
    rng = random.Random(seed)
    params = []
    for _ in range(rng.randint(1, 8)):
        params.append(SamplingParams(temperature=rng.choice([0.0, 0.5, 1.0, 2.0]), top_k=rng.choice([-1, -1, 1, 3, 50]),
                                     top_p=rng.choice([1.0, 1.0, 0.2, 0.8])))
    _sample(obs, params, seed % 10_000, steps=3)


@case("tiny-llama generates with mixed sampling settings", kind=E2E, hint=3)
def engine(obs: Obs) -> None:
    prompts = harness.random_prompts(seed=8, n=4, lo=3, hi=10)
    params = [SamplingParams(max_tokens=6, ignore_eos=True), SamplingParams(max_tokens=6, temperature=0.8, seed=3, ignore_eos=True),
              SamplingParams(max_tokens=6, temperature=1.0, top_k=10, seed=4, ignore_eos=True),
              SamplingParams(max_tokens=6, temperature=1.0, top_p=0.9, seed=5, ignore_eos=True)]
    harness.generate(obs, harness.scheduler_config(), prompts, params)
