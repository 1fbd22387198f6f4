"""Chapter 6, the sampler's OpenAI features: penalties, min_p, logit_bias, min_tokens and 64-bit
seeds (the JSON and log-probability fields, and their checks, are chapter 13's:
tests/test_ch13_request_fields.py and test_ch13_structured_output.py).

Claims: `SamplingParams` refuses out-of-range values with a message naming the field; each
logits processor equals transformers' own processor (repetition penalty, min_p, min new tokens)
or a naive per-request reference written from OpenAI's definition (presence and frequency
penalties, logit bias), batched over rows with different settings; seeds differing only above
bit 31 draw different tokens.
"""

from __future__ import annotations

import pytest

from minisgl.core import InvalidRequestError, SamplingParams


# ---- the request contract -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "kw, field",
    [
        (dict(presence_penalty=2.5), "presence_penalty"),
        (dict(frequency_penalty=-3), "frequency_penalty"),
        (dict(frequency_penalty=float("nan")), "frequency_penalty"),
        (dict(repetition_penalty=0.0), "repetition_penalty"),
        (dict(repetition_penalty=-1.0), "repetition_penalty"),
        (dict(min_p=1.5), "min_p"),
        (dict(min_p=-0.1), "min_p"),
        (dict(logit_bias=((3, 100.5),)), "logit_bias"),
        (dict(logit_bias=((-1, 1.0),)), "logit_bias"),
        (dict(logit_bias={3: 1.0}), "logit_bias"),
        (dict(logit_bias=((3, 1.0), (3, 2.0))), "logit_bias"),
        (dict(min_tokens=-1), "min_tokens"),
        (dict(seed=2**64), "seed"),
        (dict(seed=-1), "seed"),
        (dict(seed=True), "seed"),
        (dict(stop_token_ids=(-4,)), "stop_token_ids"),
    ],
)
def test_bad_sampling_params_name_the_field(kw, field):
    with pytest.raises(InvalidRequestError, match=field):
        SamplingParams(**kw)


def test_good_sampling_params_at_the_edges_are_accepted():
    SamplingParams(presence_penalty=-2, frequency_penalty=2, repetition_penalty=1e-3, min_p=1.0, logit_bias=((0, -100), (7, 100.0)),
                   min_tokens=16, seed=2**64 - 1)


# ---- logits processors, batched, against transformers' own (random logits, mixed rows) --------

import random  # noqa: E402

import torch  # noqa: E402
from transformers.generation.logits_process import (  # noqa: E402
    MinNewTokensLengthLogitsProcessor,
    MinPLogitsWarper,
    RepetitionPenaltyLogitsProcessor,
    SequenceBiasLogitsProcessor,
    TemperatureLogitsWarper,
)

from helpers import TEST_DEVICE, make_req  # noqa: E402
from minisgl.engine.processors import apply_min_p, apply_token_bitmask, make_logits_args, process_logits  # noqa: E402
from minisgl.engine.sample import make_sampling_args  # noqa: E402

VOCAB = 300
EOS = (7, 9)
DEVICE = torch.device(TEST_DEVICE)


def _batch(seed: int, settings):
    """Requests with random prompts and outputs (repeats likely), their rows of a token pool,
    and random logits. `settings[i]` are request i's SamplingParams keywords."""
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    pool = torch.randint(0, VOCAB, (len(settings) + 1, 64), generator=gen, dtype=torch.int32)  # stale ids past each length
    reqs = []
    for i, kw in enumerate(settings):
        prompt_len, out_len = rng.randint(1, 20), rng.randint(0, 20)
        ids = torch.randint(0, 40, (prompt_len + out_len,), generator=gen, dtype=torch.int32)  # a small range: repeats
        req = make_req(ids[:prompt_len].tolist(), row=len(settings) - i, max_tokens=32, uid=i, **kw)  # rows out of order
        req.input_ids = ids
        req.device_len = prompt_len + out_len  # the position being sampled
        pool[req.table_idx, : len(ids)] = ids
        reqs.append(req)
    logits = torch.randn(len(settings), VOCAB, generator=gen) * 4
    return reqs, pool.to(DEVICE), logits.to(DEVICE)


def _processed(reqs, pool, logits, bitmask=None):
    args = make_logits_args(reqs, DEVICE, pool, EOS, bitmask)
    before = logits.clone()
    out = process_logits(logits, args)
    assert torch.equal(logits, before), "the processors changed their input"
    return out.cpu()


@pytest.mark.parametrize("seed", range(3))
def test_repetition_penalty_equals_transformers(seed):
    settings = [dict(repetition_penalty=p) for p in (1.0, 1.3, 0.7, 2.0, 1.0)]
    reqs, pool, logits = _batch(seed, settings)
    got = _processed(reqs, pool, logits)
    for i, (r, kw) in enumerate(zip(reqs, settings)):
        ref = RepetitionPenaltyLogitsProcessor(kw["repetition_penalty"])(r.input_ids[None].long(), logits[i : i + 1].cpu().clone())
        assert torch.equal(got[i], ref[0]), f"row {i}"


@pytest.mark.parametrize("seed", range(3))
def test_frequency_and_presence_penalties_follow_openai(seed):
    settings = [dict(frequency_penalty=f, presence_penalty=p) for f, p in ((0, 0), (0.5, 0), (0, 1.5), (-1.0, 2.0), (2.0, -0.5))]
    reqs, pool, logits = _batch(seed, settings)
    got = _processed(reqs, pool, logits)
    for i, (r, kw) in enumerate(zip(reqs, settings)):
        ref = logits[i].cpu().clone()
        for token in set(r.output_ids.tolist()):  # OpenAI: counts over the generated tokens only
            count = r.output_ids.tolist().count(token)
            ref[token] -= count * kw["frequency_penalty"] + kw["presence_penalty"]
        torch.testing.assert_close(got[i], ref, rtol=0, atol=1e-5, msg=f"row {i}")


def test_logit_bias_equals_transformers_sequence_bias():
    settings = [dict(logit_bias=((3, -100.0), (250, 5.5))), dict(), dict(logit_bias=((3, 100.0), (0, -0.25), (299, 1.0)))]
    reqs, pool, logits = _batch(0, settings)
    got = _processed(reqs, pool, logits)
    for i, (r, kw) in enumerate(zip(reqs, settings)):
        ref = logits[i : i + 1].cpu().clone()
        if kw:
            ref = SequenceBiasLogitsProcessor({(t,): b for t, b in kw["logit_bias"]})(r.input_ids[None].long(), ref)
        torch.testing.assert_close(got[i], ref[0], rtol=0, atol=1e-5, msg=f"row {i}")


def test_min_tokens_masks_eos_and_stop_ids_like_transformers():
    settings = [dict(min_tokens=30), dict(min_tokens=0), dict(min_tokens=30, stop_token_ids=(11,)), dict(min_tokens=30, ignore_eos=True, stop_token_ids=(12,))]
    reqs, pool, logits = _batch(1, settings)
    got = _processed(reqs, pool, logits)
    for i, (r, kw) in enumerate(zip(reqs, settings)):
        stops = ([] if kw.get("ignore_eos") else list(EOS)) + list(kw.get("stop_token_ids", ()))
        ref = logits[i : i + 1].cpu().clone()
        if stops:
            ref = MinNewTokensLengthLogitsProcessor(r.prompt_len, kw["min_tokens"], stops)(r.input_ids[None].long(), ref)
        assert torch.equal(got[i], ref[0]), f"row {i}"
    # once a row has min_tokens outputs, nothing is masked
    done = [make_req([1, 2], row=0, max_tokens=8, min_tokens=1)]
    done[0].device_len = 3
    assert make_logits_args(done, DEVICE, pool, EOS) is None


@pytest.mark.parametrize("seed", range(3))
def test_min_p_equals_transformers_after_temperature(seed):
    settings = [dict(min_p=m, temperature=t) for m, t in ((0.0, 1.0), (0.05, 1.0), (0.3, 0.5), (0.9, 2.0), (0.2, 0.0))]
    reqs, _, logits = _batch(seed, settings)
    sampling = make_sampling_args(reqs, VOCAB, DEVICE)
    got = apply_min_p(logits, sampling.temperatures, make_logits_args(reqs, DEVICE, _, EOS).min_p).cpu()
    for i, kw in enumerate(settings):
        row = logits[i : i + 1].cpu().clone()
        if kw["temperature"] == 0:  # greedy: only the argmax must survive
            assert torch.isfinite(got[i, row.argmax()])
            continue
        ref = MinPLogitsWarper(kw["min_p"]) (None, TemperatureLogitsWarper(kw["temperature"])(None, row)) if kw["min_p"] else row
        assert torch.equal(torch.isinf(got[i]), torch.isinf(ref[0])), f"row {i}"
        assert torch.equal(got[i][torch.isfinite(got[i])], logits[i].cpu()[torch.isfinite(got[i])])


def test_grammar_bitmask_equals_xgrammars_own_kernel():
    xgr = pytest.importorskip("xgrammar")
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(3, VOCAB, generator=gen)
    bitmask = torch.randint(-(2**31), 2**31 - 1, (3, (VOCAB + 31) // 32), generator=gen, dtype=torch.int32)
    ref = logits.clone()
    xgr.apply_token_bitmask_inplace(ref, bitmask)
    assert torch.equal(apply_token_bitmask(logits.to(DEVICE), bitmask.to(DEVICE)).cpu(), ref)


def test_all_processors_in_one_batch_each_row_as_if_alone():
    """Batching is invisible: a row's processed logits do not depend on the other rows."""
    settings = [dict(repetition_penalty=1.2, logit_bias=((5, 3.0),)), dict(frequency_penalty=0.7, min_tokens=40),
                dict(), dict(presence_penalty=-1.0, repetition_penalty=0.8, logit_bias=((6, -2.0),), min_tokens=40)]
    reqs, pool, logits = _batch(4, settings)
    together = _processed(reqs, pool, logits)
    for i in range(len(reqs)):
        args = make_logits_args([reqs[i]], DEVICE, pool, EOS)
        alone = process_logits(logits[i : i + 1], args).cpu() if args is not None else logits[i : i + 1].cpu()
        assert torch.equal(together[i], alone[0]), f"row {i}"


def test_plain_rows_need_no_processing():
    reqs, pool, _ = _batch(0, [dict(), dict(temperature=1.0, top_p=0.5)])
    assert make_logits_args(reqs, DEVICE, pool, EOS) is None


# ---- 64-bit seeds ----------------------------------------------------------------------------------

from minisgl.engine.sample import _mix32, hashed_uniform  # noqa: E402


def _hash_below_2_32(seeds, steps, vocab):
    """The single-lane hash every seed below 2**32 has always used (the one-lane reference)."""
    idx = torch.arange(vocab, dtype=torch.int64)
    m = 0xFFFFFFFF
    base = _mix32((_mix32(seeds & m) ^ (steps * 0x9E3779B1 & m)) & m)
    x = _mix32((base[:, None] + idx[None, :] * 0x85EBCA77) & m)
    return ((x >> 8).float() + 0.5) / float(1 << 24)


def test_seeds_use_all_64_bits():
    low = [5, 2**31 + 5, 2**32 + 5, 2**63 + 5, 2**64 - 1, 2**63]
    seeds = torch.tensor([s - 2**64 if s >= 2**63 else s for s in low], dtype=torch.int64)
    u = hashed_uniform(seeds, torch.full((len(low),), 3), 1000)
    for i in range(len(low)):
        for j in range(i):
            assert not torch.equal(u[i], u[j]), f"seeds {low[i]} and {low[j]} draw the same numbers"
    small = torch.tensor([0, 5, 2**31 + 5, 2**32 - 1])
    assert torch.equal(hashed_uniform(small, torch.full((4,), 9), 1000), _hash_below_2_32(small, torch.full((4,), 9), 1000))
    big = hashed_uniform(seeds[3:], torch.full((3,), 7), 100_000)
    assert abs(float(big.mean()) - 0.5) < 0.005 and abs(float(big.var()) - 1 / 12) < 0.002


def test_make_sampling_args_keeps_the_seed_bits():
    reqs = [make_req([1, 2], row=i, temperature=1.0) for i in range(3)]
    for r, s in zip(reqs, (5, 2**31 + 5, 2**64 - 1)):
        r.seed = s
    assert make_sampling_args(reqs, 10, DEVICE).seeds.tolist() == [5, 2**31 + 5, -1]


# ---- end to end: the offline engine against transformers' generate --------------------------------

from helpers import TINY_LLAMA, build_llm, eos_ids, hf_greedy, hf_logits, hf_model, needs_real_smollm2  # noqa: E402
from minisgl.core import SamplingParams as SP  # noqa: E402

PROMPTS = [[1, 450, 4996, 17354, 1701, 29916], [1, 306, 763, 278, 29871, 29906, 29900, 29896], [1, 12148, 263], [5, 6, 7, 8, 9, 10, 11]]


@pytest.fixture(scope="module")
def llm():
    return build_llm(TINY_LLAMA, max_running_reqs=8)


def _hf_generate(prompt, n, **kw):
    out = hf_model(TINY_LLAMA).generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False, pad_token_id=2, **kw)
    return out[0, len(prompt):].tolist()


def _hf_naive(prompt, n, frequency=0.0, presence=0.0):
    """Greedy with OpenAI's frequency and presence penalties, one full forward per token."""
    seq, out = list(prompt), []
    for _ in range(n):
        logits = hf_logits(TINY_LLAMA, seq)[-1].clone()
        for t in set(out):
            logits[t] -= out.count(t) * frequency + presence
        out.append(int(logits.argmax()))
        seq.append(out[-1])
        if out[-1] in eos_ids(TINY_LLAMA):
            break
    return out


def test_penalties_bias_and_min_tokens_end_to_end_in_one_batch(llm):
    eos = eos_ids(TINY_LLAMA)[0]
    n = 12
    # a random model rarely repeats a token greedily: penalties below 1 / below 0 reward repeats,
    # so they visibly change the output
    params = [SP(max_tokens=n), SP(max_tokens=n, repetition_penalty=0.5), SP(max_tokens=n, logit_bias=((eos, 100.0),), min_tokens=5),
              SP(max_tokens=n, frequency_penalty=-1.5, presence_penalty=0.5)]
    outs = llm.generate(PROMPTS, params)
    llm.assert_all_free()
    assert outs[0].token_ids == hf_greedy(TINY_LLAMA, PROMPTS[0], n), "a plain greedy row changed"
    assert outs[1].token_ids == _hf_generate(PROMPTS[1], n, repetition_penalty=0.5)
    assert outs[1].token_ids != hf_greedy(TINY_LLAMA, PROMPTS[1], n), "the penalty had no effect: pick a stronger one"
    # the bias makes EOS the argmax at once; min_tokens holds it off for five tokens
    assert outs[2].token_ids == _hf_generate(PROMPTS[2], n, sequence_bias={(eos,): 100.0}, min_new_tokens=5)
    assert len(outs[2].token_ids) == 6 and outs[2].finish_reason == "stop"
    assert outs[3].token_ids == _hf_naive(PROMPTS[3], n, frequency=-1.5, presence=0.5)
    assert outs[3].token_ids != hf_greedy(TINY_LLAMA, PROMPTS[3], n), "the penalties had no effect: pick stronger ones"


def test_a_negative_bias_removes_a_token(llm):
    plain = llm.generate([PROMPTS[0]], SP(max_tokens=8))[0].token_ids
    banned = tuple((t, -100.0) for t in set(plain))
    biased = llm.generate([PROMPTS[0]], SP(max_tokens=8, logit_bias=banned))[0].token_ids
    assert not set(biased) & set(plain)


def test_seeds_differing_above_bit_31_give_different_text(llm):
    outs = llm.generate([PROMPTS[0]] * 3, [SP(max_tokens=8, temperature=1.0, seed=s) for s in (5, 2147483653, 5)])
    assert outs[0].token_ids == outs[2].token_ids
    assert outs[0].token_ids != outs[1].token_ids


def test_sampling_with_min_p_is_reproducible_and_stays_in_the_kept_set(llm):
    outs = llm.generate([PROMPTS[1]] * 2, [SP(max_tokens=6, temperature=1.0, min_p=0.5, seed=11)] * 2)
    assert outs[0].token_ids == outs[1].token_ids
    probs = torch.softmax(hf_logits(TINY_LLAMA, PROMPTS[1] + outs[0].token_ids), -1)[len(PROMPTS[1]) - 1 : -1]
    for i, token in enumerate(outs[0].token_ids):
        assert probs[i, token] >= 0.5 * probs[i].max() * (1 - 1e-5)


@pytest.mark.parametrize("kw, field", [(dict(logit_bias=((10**6, 1.0),)), "logit_bias"), (dict(stop_token_ids=(10**6,)), "stop_token_ids"),
                                       (dict(max_tokens=4, min_tokens=5), "min_tokens")])
def test_the_scheduler_refuses_what_the_model_cannot_honour(llm, kw, field):
    with pytest.raises(InvalidRequestError, match=field):
        llm.add_request(PROMPTS[0], SP(**kw))
    assert llm.is_idle
    llm.assert_all_free()


# ---- the wire: the new fields travel ---------------------------------------------------------------

import json  # noqa: E402

from minisgl.message import DetokenizeMsg, UserMsg, deserialize, serialize  # noqa: E402


def test_new_fields_survive_serialisation():
    sp = SP(presence_penalty=0.5, frequency_penalty=-1, repetition_penalty=1.1, min_p=0.05, logit_bias=((3, -100.0), (9, 2.5)),
            logprobs=3, min_tokens=0, json_mode="schema", json_schema=json.dumps({"type": "object", "required": ["ok"]}), seed=2**64 - 1)
    back = deserialize(serialize(UserMsg(1, torch.tensor([1, 2], dtype=torch.int32), sp)))
    assert back.sampling_params == sp
    msg = DetokenizeMsg(4, 17, None, -0.25, ((17, -0.25), (3, -1.5)))
    assert deserialize(serialize(msg)) == msg
