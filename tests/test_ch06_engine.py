"""Chapter 6, the engine and the sampler.

Claims: the engine's logits, teacher-forced through prefill, chunked prefill and decode steps over
the paged pool, equal transformers' logits for the same tokens (float32, tight tolerance), alone
or batched with other requests; `forward_batch` moves every ledger on and returns the argmax for
greedy requests. The sampler draws from softmax(logits / T) restricted by top-k / top-p, with
randomness that is a pure function of (seed, position, token): reproducible and independent of
which other requests share the batch.
"""

from __future__ import annotations

import math

import pytest
import torch

from helpers import (
    SMOLLM2,
    TEST_DTYPE,
    TINY_LLAMA,
    TINY_QWEN2,
    TINY_QWEN3,
    build_engine,
    encode,
    engine_logits,
    fill_batch,
    hf_greedy,
    hf_logits,
    make_req,
    map_rows,
)
from minisgl.core import Batch
from minisgl.engine.sample import BatchSamplingArgs, Sampler, hashed_uniform, make_sampling_args

MODELS = [SMOLLM2, TINY_QWEN3, TINY_LLAMA, TINY_QWEN2]
TEXTS = [
    "The quick brown fox jumps over the lazy dog because it wanted to see what was on the other side.",
    "Hi",
    "Water boils at a temperature of",
]
# float32 on either device: tight. bfloat16 (GPU runs with MINISGL_TEST_DTYPE=bfloat16): the
# weights and activations are rounded to 8 bits of mantissa, so logits move by a few hundredths
# of their range; the bound below is what teacher forcing must stay within.
TOL = dict(rtol=1e-4, atol=1e-4) if TEST_DTYPE == "float32" else dict(rtol=0.05, atol=0.6)


@pytest.fixture(scope="module", params=MODELS, ids=[m.name for m in MODELS])
def model_case(request):
    """An engine, the prompts, and for each prompt transformers' greedy continuation and the
    logits of transformers' single forward pass over prompt + continuation."""
    path = request.param
    engine = build_engine(path, page_size=4)
    prompts = [encode(t) for t in TEXTS]
    conts = [hf_greedy(path, p, 5, stop_at_eos=False) for p in prompts]
    refs = [hf_logits(path, p + c) for p, c in zip(prompts, conts)]
    return engine, prompts, conts, refs


def _teacher_force(engine, prompts, conts, chunk: int | None = None):
    """Prefill all prompts in one batch (optionally as a first chunk of `chunk` tokens, then the
    rest), then decode the continuations together. Returns per-request lists of logits."""
    reqs = [make_req(p, row=i, uid=i, max_tokens=len(c) + 1) for i, (p, c) in enumerate(zip(prompts, conts))]
    map_rows(engine.page_table, engine.page_size, reqs, [r.max_device_len for r in reqs], engine.num_pages, seed=7)
    got = [[] for _ in reqs]
    if chunk is not None:
        for r in reqs:
            r.device_len = min(chunk, r.prompt_len)
        first = [r for r in reqs if r.is_chunk]
        engine_logits(engine, first, "prefill")  # the chunk's logits are thrown away
        for r in first:
            assert r.cached_len == chunk and r.device_len == r.prompt_len
    logits = engine_logits(engine, reqs, "prefill")
    for i in range(len(reqs)):
        got[i].append(logits[i])
    for step in range(len(conts[0])):
        for r, c in zip(reqs, conts):
            r.append_host(c[step])
        logits = engine_logits(engine, reqs, "decode")
        for i in range(len(reqs)):
            got[i].append(logits[i])
    return got


def test_engine_logits_equal_transformers_logits_through_prefill_and_decode(model_case):
    engine, prompts, conts, refs = model_case
    got = _teacher_force(engine, prompts, conts)
    for p, ref, mine in zip(prompts, refs, got):
        expected = ref[len(p) - 1 :]  # logits at the last prompt position, then at each new token
        torch.testing.assert_close(torch.stack(mine), expected, **TOL)


def test_engine_logits_equal_transformers_logits_after_a_chunked_prefill(model_case):
    engine, prompts, conts, refs = model_case
    got = _teacher_force(engine, prompts, conts, chunk=5)
    for p, ref, mine in zip(prompts, refs, got):
        torch.testing.assert_close(torch.stack(mine), ref[len(p) - 1 :], **TOL)


def test_forward_batch_returns_the_argmax_and_moves_ledgers(model_case):
    engine, prompts, conts, refs = model_case
    reqs = [make_req(p, row=i, uid=i) for i, p in enumerate(prompts)]
    map_rows(engine.page_table, engine.page_size, reqs, [r.max_device_len for r in reqs], engine.num_pages)
    batch = Batch(reqs=reqs, phase="prefill")
    fill_batch(batch, engine.page_table)
    tokens = engine.forward_batch(batch, None).tokens
    assert tokens.dtype == torch.int32
    assert tokens.tolist() == [c[0] for c in conts]
    assert [(r.cached_len, r.device_len) for r in reqs] == [(len(p), len(p) + 1) for p in prompts]


# ---- the sampler ------------------------------------------------------------------------------

LOGITS = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0])


def _args(n: int, temperature=1.0, top_k=5, top_p=1.0, seeds=None, steps=None) -> BatchSamplingArgs:
    full = lambda v, dt: torch.full((n,), v, dtype=dt)  # noqa: E731
    return BatchSamplingArgs(
        temperatures=full(temperature, torch.float32),
        top_k=full(top_k, torch.int64),
        top_p=full(top_p, torch.float32),
        seeds=torch.arange(n, dtype=torch.int64) if seeds is None else seeds,
        steps=full(3, torch.int64) if steps is None else steps,
        use_top_k=top_k < 5,
        use_top_p=top_p < 1.0,
    )


def _empirical(n: int, **kw) -> torch.Tensor:
    tokens = Sampler(5).sample(LOGITS.expand(n, 5).clone(), _args(n, **kw))
    return torch.bincount(tokens.long(), minlength=5).double()


def _chi_square(counts: torch.Tensor, probs: torch.Tensor) -> float:
    expected = probs.double() * counts.sum()
    support = expected > 0
    assert counts[~support].sum() == 0, "sampled a token outside the allowed set"
    return float(((counts[support] - expected[support]) ** 2 / expected[support]).sum())


# chi-square critical values at p = 0.001 for 4 and 1 degrees of freedom
CHI2_DF4, CHI2_DF1 = 18.47, 10.83
N_DRAWS = 20000


@pytest.mark.parametrize("temperature", [1.0, 0.5, 2.0])
def test_empirical_distribution_matches_softmax(temperature):
    """Seeds 0..N-1 at one position: the exponential race picks token i with probability p_i."""
    counts = _empirical(N_DRAWS, temperature=temperature)
    assert _chi_square(counts, torch.softmax(LOGITS / temperature, -1)) < CHI2_DF4


def test_top_k_samples_from_the_renormalised_top_k():
    counts = _empirical(N_DRAWS, top_k=2)
    p = torch.softmax(LOGITS, -1)
    p[2:] = 0
    assert _chi_square(counts, p / p.sum()) < CHI2_DF1


def test_top_p_keeps_the_smallest_set_reaching_p():
    p = torch.softmax(LOGITS, -1)  # [0.61, 0.22, 0.14, ...]: 0.7 needs the first two
    counts = _empirical(N_DRAWS, top_p=0.7)
    kept = p.clone()
    kept[2:] = 0
    assert _chi_square(counts, kept / kept.sum()) < CHI2_DF1


def _kept_by_sampler(logits: torch.Tensor, temperature: float, top_k: int, top_p: float, monkeypatch) -> torch.Tensor:
    """Which tokens the sampler can draw, exactly: row j of the batch gets a uniform draw near 1
    at token j alone (so its race term is huge there), which wins iff token j kept some mass."""
    from minisgl.engine import sample as sample_mod

    v = logits.shape[-1]
    u = torch.full((v, v), math.exp(-1.0))
    u.fill_diagonal_(1.0 - 2.0**-24)
    monkeypatch.setattr(sample_mod, "hashed_uniform", lambda seeds, steps, vocab: u)
    args = _args(v, temperature=temperature, top_k=top_k, top_p=top_p)
    args.use_top_k, args.use_top_p = top_k < v, top_p < 1.0
    tokens = Sampler(v).sample(logits.expand(v, v).clone(), args)
    return tokens.long() == torch.arange(v)


@pytest.mark.parametrize("top_k,top_p", [(5, 0.5), (10, 0.3), (3, 0.6), (40, 0.6), (64, 0.8), (20, 1.0), (1, 0.5)])
def test_top_k_then_top_p_keeps_what_transformers_warpers_keep(top_k, top_p, monkeypatch):
    """transformers applies TopKLogitsWarper, then TopPLogitsWarper to the renormalised rest."""
    from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    gen = torch.Generator().manual_seed(top_k * 100 + int(top_p * 10))
    renormalisation_mattered = False
    for trial in range(6):
        logits = torch.randn(64, generator=gen) * 1.5
        temperature = [1.0, 0.7, 1.3][trial % 3]
        x = TemperatureLogitsWarper(temperature)(None, logits[None].clone())
        x = TopPLogitsWarper(top_p)(None, TopKLogitsWarper(top_k)(None, x)) if top_p < 1.0 else TopKLogitsWarper(top_k)(None, x)
        want = torch.isfinite(x[0])
        assert torch.equal(_kept_by_sampler(logits, temperature, top_k, top_p, monkeypatch), want)
        # top-p over the whole distribution instead would keep more here
        sorted_p = torch.softmax(logits / temperature, -1).sort(descending=True).values
        unrenormalised = int(((sorted_p.cumsum(-1) - sorted_p) <= top_p).sum().clamp(max=top_k))
        renormalisation_mattered |= unrenormalised != int(want.sum())
    assert renormalisation_mattered or top_p == 1.0 or top_k in (1, 64)


@pytest.mark.parametrize("kw", [dict(top_k=1), dict(top_p=1e-6), dict(temperature=1e-7)], ids=["top_k=1", "top_p~0", "T~0"])
def test_degenerate_sampling_is_greedy(kw):
    logits = torch.randn(64, 5, generator=torch.Generator().manual_seed(0))
    tokens = Sampler(5).sample(logits, _args(64, **kw))
    assert torch.equal(tokens.long(), logits.argmax(-1))


def test_temperature_zero_rows_are_greedy_in_a_mixed_batch():
    logits = torch.randn(6, 5, generator=torch.Generator().manual_seed(1))
    args = _args(6)
    args.temperatures[::2] = 0.0
    tokens = Sampler(5).sample(logits, args)
    assert torch.equal(tokens[::2].long(), logits[::2].argmax(-1))


def test_all_greedy_batch_needs_no_sampling_args():
    reqs = [make_req([1, 2], row=0), make_req([3], row=1, temperature=0.8, top_k=1)]
    assert make_sampling_args(reqs, 5, torch.device("cpu")) is None


def test_sampling_args_use_the_position_of_the_new_token():
    r = make_req([1, 2, 3], row=0, temperature=0.8, seed=11)
    r.seed = 11
    args = make_sampling_args([r], 5, torch.device("cpu"))
    assert args.steps.tolist() == [3] and args.seeds.tolist() == [11] and not args.use_top_k


def test_draws_are_a_pure_function_of_seed_and_position():
    seeds, steps = torch.tensor([5, 5, 6, 5]), torch.tensor([10, 11, 10, 10])
    u = hashed_uniform(seeds, steps, 1000)
    assert torch.equal(u, hashed_uniform(seeds, steps, 1000))  # reproducible
    assert torch.equal(u[0], u[3])  # same (seed, step): same draws, wherever the row sits
    assert not torch.equal(u[0], u[1]) and not torch.equal(u[0], u[2])
    many = hashed_uniform(torch.arange(100), torch.full((100,), 7), 1000)  # 100k draws
    assert bool(((many > 0) & (many < 1)).all())
    assert abs(float(many.mean()) - 0.5) < 0.005 and abs(float(many.var()) - 1 / 12) < 0.002


# (seed, position) whose hash reaches its top value, 2**24 - 1, at token 3 of a 100-token vocabulary
# (found by search); float32 rounded that draw to exactly 1.0
TOP_SEED, TOP_STEP, TOP_TOKEN = 142182, 5, 3


def test_the_top_of_the_hash_stays_below_one():
    u = hashed_uniform(torch.tensor([TOP_SEED]), torch.tensor([TOP_STEP]), 100)
    assert int(u.argmax()) == TOP_TOKEN and float(u.max()) > 1 - 2**-23, "not the top of the hash: the search is stale"
    assert float(u.max()) < 1.0  # -log(u) > 0: no race term divides by zero


@pytest.mark.parametrize("excluded_by", ["bitmask", "top_k"])
def test_a_token_with_no_probability_never_wins_the_race(excluded_by):
    """A token at probability 0 (masked by a grammar, or cut by top-k) with the largest draw of its
    row: with u = 1.0 its race term was 0 / 0, NaN, and argmax picked it."""
    from minisgl.engine.processors import LogitsArgs
    from minisgl.engine.sample import SamplingPlan

    v, allowed = 100, 7
    logits = torch.randn(1, v, generator=torch.Generator().manual_seed(0))
    logits[0, allowed] = logits.max() + 1  # the most likely token: the one top-k keeps
    args = BatchSamplingArgs(torch.tensor([1.0]), torch.tensor([v]), torch.tensor([1.0]), torch.tensor([TOP_SEED]),
                             torch.tensor([TOP_STEP]), use_top_k=False, use_top_p=False)
    mask = None
    if excluded_by == "bitmask":
        mask = torch.zeros(1, (v + 31) // 32, dtype=torch.int32)
        mask[0, allowed // 32] = 1 << (allowed % 32)
    else:
        args.top_k, args.use_top_k = torch.tensor([1]), True
    out = Sampler(v).run(logits, SamplingPlan(args, LogitsArgs(bitmask=mask) if mask is not None else None))
    assert out.tokens.tolist() == [allowed]


def test_a_row_samples_the_same_token_whatever_shares_its_batch():
    gen = torch.Generator().manual_seed(2)
    mine, others = torch.randn(1, 5, generator=gen), torch.randn(3, 5, generator=gen)
    sampler = Sampler(5)
    alone = sampler.sample(mine, _args(1, seeds=torch.tensor([42])))
    for pos in range(4):
        logits = torch.cat([others[:pos], mine, others[pos:]])
        seeds = torch.cat([torch.tensor([1, 2, 3])[:pos], torch.tensor([42]), torch.tensor([1, 2, 3])[pos:]])
        batch = sampler.sample(logits, _args(4, seeds=seeds, top_k=3))
        assert int(batch[pos]) == int(sampler.sample(mine, _args(1, seeds=torch.tensor([42]), top_k=3)))
    assert alone.shape == (1,)


def test_after_sampling_reports_read_the_untouched_logits_and_an_unknown_one_is_refused():
    """A report a plan names runs after the draw on the model's own logits (a bias moved the draw,
    not what the report sees); a plan naming a report nobody registered raises."""
    from minisgl.engine.processors import LogitsArgs
    from minisgl.engine.sample import SamplingPlan, after_sampling

    @after_sampling("test-echo")
    def echo(logits: torch.Tensor, tokens: torch.Tensor, scale: float) -> tuple:
        return logits * scale, tokens

    logits = torch.tensor([[0.0, 3.0, 1.0]])
    biased = LogitsArgs(bias_index=(torch.tensor([0]), torch.tensor([1])), bias_values=torch.tensor([-100.0]))
    out = Sampler(3).run(logits, SamplingPlan(None, biased, reports={"test-echo": 2.0}))
    assert out.tokens.tolist() == [2]  # the bias moved the greedy draw off token 1
    seen, tokens = out.reports["test-echo"]
    assert torch.equal(seen, logits * 2.0) and tokens is out.tokens
    assert Sampler(3).run(logits, SamplingPlan(None, biased)).reports == {}
    with pytest.raises(LookupError, match="no module registered"):
        Sampler(3).run(logits, SamplingPlan(None, reports={"no-such-report": 1}))
