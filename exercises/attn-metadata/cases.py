"""Cases for attn-metadata: metadata of scripted and random batches; engine runs with logits."""

import random

import torch

from judge import harness
from judge.api import E2E, Obs, case, snapshot
from minisgl.attention.torch_backend import TorchAttnBackend
from minisgl.core import Batch, Req, SamplingParams
from minisgl.kvcache import BaseCacheHandle


PAD_SLOT = 12_345  # not a value the made-up page tables hold, so a padding entry is recognisable


def _batch(obs: Obs, specs, phase: str, seed: int = 0) -> None:
    """specs: (cached_len, device_len) per request; rows hold made-up slots (0 to 9999)."""
    gen = torch.Generator().manual_seed(seed)
    page_table = torch.randint(0, 10_000, (len(specs) + 2, 64), generator=gen, dtype=torch.int32).to(harness.device())
    reqs = []
    for i, (cached, dev) in enumerate(specs):
        r = Req(torch.arange(dev, dtype=torch.int32), len(specs) - i, cached, i, SamplingParams(max_tokens=8), BaseCacheHandle(0))
        r.device_len = dev
        reqs.append(r)
    batch = Batch(reqs=reqs, phase=phase)
    before = snapshot(page_table)
    TorchAttnBackend(None, page_table, pad_slot=PAD_SLOT).prepare_metadata(batch)
    obs.unchanged("the page table", before, page_table)
    m = batch.attn_metadata
    obs.eq("q_starts (where each request's queries begin)", list(m.q_starts))
    obs.eq("cached_lens", list(m.cached_lens))
    obs.eq("kv_lens", list(m.kv_lens))
    obs.eq("kv_mask", m.kv_mask)
    for i in range(len(reqs)):
        obs.eq(f"request {i}: kv_slots (page-table slots, then self.pad_slot = {PAD_SLOT} past kv_lens[{i}])", m.kv_slots[i])


@case("one prefill, nothing cached", hint=1)
def one(obs: Obs) -> None:
    _batch(obs, [(0, 5)], "prefill")


@case("three prefills with prefix-cache hits", hint=2)
def prefix(obs: Obs) -> None:
    _batch(obs, [(0, 4), (3, 9), (6, 7)], "prefill")


@case("a decode batch of four", hint=3)
def decode(obs: Obs) -> None:
    _batch(obs, [(4, 5), (9, 10), (1, 2), (15, 16)], "decode")


@case("random batches", seeds=4, hint=3)
def random_batches(obs: Obs, seed: int) -> None:
    rng = random.Random(seed)
    phase = rng.choice(["prefill", "decode"])
    specs = []
    for _ in range(rng.randint(1, 6)):
        dev = rng.randint(1, 60)
        specs.append((dev - 1 if phase == "decode" else rng.randint(0, dev - 1), dev))
    obs.eq("scenario: phase and (cached_len, device_len) per request", [phase, specs])
    _batch(obs, specs, phase, seed)


@case("tiny-llama: logits under teacher forcing, then prefix-cache hits", kind=E2E, hint=2)
def engine(obs: Obs) -> None:
    cfg = harness.scheduler_config()
    rows = harness.teacher_forced_logits(cfg, [5, 17, 300, 42, 9, 77], [12, 900, 33, 4])
    for step, logits in enumerate(rows):
        obs.close(f"logits after step {step} (a fixed sample of 256 vocabulary columns)", logits)
    prompts = harness.random_prompts(seed=4, n=4, lo=2, hi=9, shared_prefix=6)
    harness.generate(obs, cfg, prompts, SamplingParams(max_tokens=5, ignore_eos=True), rounds=2)
