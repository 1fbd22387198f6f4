"""Cases for req-lengths: ledgers driven step by step, and a chunked-prefill run of the engine."""

import random

import torch

from judge import harness
from judge.api import E2E, Obs, case
from minisgl.core import Req, SamplingParams
from minisgl.kvcache import BaseCacheHandle


def _req(prompt_len: int, max_tokens: int, cached: int = 0) -> Req:
    ids = torch.arange(100, 100 + prompt_len, dtype=torch.int32)
    return Req(ids, 0, cached, 0, SamplingParams(max_tokens=max_tokens), BaseCacheHandle(cached))


def _observe(obs: Obs, tag: str, req: Req) -> None:
    obs.eq(f"{tag}: lengths (cached_len, device_len, max_device_len)", [req.cached_len, req.device_len, req.max_device_len])
    obs.eq(f"{tag}: extend_len, remain_len", [req.extend_len, req.remain_len])
    obs.eq(f"{tag}: is_chunk, can_decode", [req.is_chunk, req.can_decode])


def _drive(obs: Obs, req: Req, chunk: int, steps: int) -> None:
    """What the scheduler does: cut the prompt into chunks of `chunk`, then decode one token a step."""
    if req.prompt_len - req.cached_len > chunk:
        req.device_len = req.cached_len + chunk
    _observe(obs, "before the first pass", req)
    for step in range(steps):
        if req.remain_len == 0 and not req.is_chunk:
            break
        req.complete_one()
        if req.prompt_len - req.cached_len > chunk:  # the rest of the prompt is still too long
            req.device_len = req.cached_len + chunk
        _observe(obs, f"after pass {step}", req)


@case("a 5-token prompt, prefill then 3 decode steps", hint=1)
def short_prompt(obs: Obs) -> None:
    _drive(obs, _req(5, 3), chunk=100, steps=5)


@case("a prompt whose first 4 tokens come from the prefix cache", hint=1)
def cached_prefix(obs: Obs) -> None:
    _drive(obs, _req(10, 2, cached=4), chunk=100, steps=4)


@case("a 10-token prompt prefilled in chunks of 4", hint=2)
def chunked(obs: Obs) -> None:
    _drive(obs, _req(10, 2), chunk=4, steps=8)


@case("a finished request cannot decode", hint=3)
def finished(obs: Obs) -> None:
    req = _req(4, 5)
    req.complete_one()
    req.finished = True
    _observe(obs, "after prefill, marked finished", req)


@case("random ledgers", seeds=3, hint=2)
def random_ledgers(obs: Obs, seed: int) -> None:
    rng = random.Random(seed)
    for i in range(6):
        prompt = rng.randint(1, 40)
        req = _req(prompt, rng.randint(1, 6), cached=rng.randint(0, prompt - 1))
        obs.eq(f"ledger {i}: prompt_len", prompt)
        _drive(obs, req, chunk=rng.randint(1, 12), steps=60)


@case("tiny-llama generates with chunked prefill (chunks of 6 tokens)", kind=E2E, hint=2)
def engine_chunked(obs: Obs) -> None:
    prompts = harness.random_prompts(seed=7, n=4, lo=3, hi=20)
    harness.generate(obs, harness.scheduler_config(max_extend_tokens=6), prompts, SamplingParams(max_tokens=4, ignore_eos=True))
