"""Chapter 10, chunked prefill.

Claims: no prefill step computes more than `max_extend_tokens` tokens; a long prompt is cut into
chunks that continue first in the next steps and add up to exactly its uncached part; nothing is
sampled from a chunk; and the tokens are still transformers' (with and without a prefix hit).
"""

from __future__ import annotations

import pytest

from helpers import MAX_TOKENS, SMOLLM2, TINY_QWEN3, build_llm, generate_ids, prompt_ids
from minisgl.core import SamplingParams


def _prefill_steps(trace, uid):
    return [(t.step, t.extend_lens[t.uids.index(uid)], t.cached_lens[t.uids.index(uid)]) for t in trace
            if t.phase == "prefill" and uid in t.uids]


@pytest.mark.parametrize("budget", [1, 7, 16])
def test_budget_caps_every_prefill_step_and_chunks_add_up(budget, hf_refs):
    llm = build_llm(TINY_QWEN3, max_extend_tokens=budget, max_running_reqs=8, page_size=4)
    prompts = prompt_ids(TINY_QWEN3)
    outs = llm.generate(prompts, [SamplingParams(max_tokens=n) for n in MAX_TOKENS])
    llm.assert_all_free()
    assert [o.token_ids for o in outs] == [hf_refs.get(TINY_QWEN3, p, n) for p, n in zip(prompts, MAX_TOKENS)]
    for t in llm.trace:
        if t.phase == "prefill":
            assert sum(t.extend_lens) <= budget
    for o, p in zip(outs, prompts):
        steps = _prefill_steps(llm.trace, o.uid)
        hit = steps[0][2]  # the prefix another finished request left in the radix cache
        assert sum(n for _, n, _ in steps) == len(p) - hit  # each uncached token computed exactly once
        assert [c for _, _, c in steps] == [hit + sum(n for _, n, _ in steps[:i]) for i in range(len(steps))]
        assert len(steps) >= -(-(len(p) - hit) // budget)


def test_a_chunked_prompt_continues_first_in_the_next_step():
    llm = build_llm(TINY_QWEN3, max_extend_tokens=7, max_running_reqs=4)
    long_prompt, short = prompt_ids(TINY_QWEN3)[4], prompt_ids(TINY_QWEN3)[1]  # 34 and 5 tokens
    llm.generate([long_prompt, short], SamplingParams(max_tokens=2))
    llm.assert_all_free()
    prefills = [t for t in llm.trace if t.phase == "prefill"]
    # 34 tokens at 7 per step: five chunks of 7, 7, 7, 7, 6; the short prompt fills the sixth step
    assert [t.uids[0] for t in prefills[:5]] == [0] * 5
    assert [t.extend_lens[0] for t in prefills[:5]] == [7, 7, 7, 7, 6]
    assert prefills[4].uids == [0, 1] and prefills[4].extend_lens == [6, 1]
    assert prefills[5].uids == [1] and prefills[5].extend_lens == [4]
    # decoding waits until no prompt is half done
    first_decode = next(t.step for t in llm.trace if t.phase == "decode")
    assert first_decode > prefills[4].step


def test_chunked_prefill_on_a_real_model_with_a_prefix_hit(hf_refs):
    llm = build_llm(SMOLLM2, max_extend_tokens=7, page_size=4, prefix_cache="radix")
    first, second = prompt_ids()[2], prompt_ids()[4]
    generate_ids(llm, [first], 2)
    start = len(llm.trace)
    out = llm.generate([second], SamplingParams(max_tokens=6))[0]
    llm.assert_all_free()
    assert out.cached_tokens > 20 and out.token_ids == hf_refs.get(SMOLLM2, second, 6)
    steps = _prefill_steps(llm.trace[start:], out.uid)
    assert steps[0][2] == out.cached_tokens  # the first chunk starts after the reused prefix
    assert sum(n for _, n, _ in steps) == len(second) - out.cached_tokens
    assert all(n <= 7 for _, n, _ in steps)


def _run_with_arrivals(llm, first, later, arrive_after: int):
    """Add `first` (a list of (ids, params)), step `arrive_after` times, add `later`, run dry.
    Returns the uids in the order given."""
    uids = [llm.add_request(ids, sp) for ids, sp in first]
    for _ in range(arrive_after):
        llm.step()
    uids += [llm.add_request(ids, sp) for ids, sp in later]
    while not llm.is_idle:
        llm.step()
    return uids


def _long_prompt(n: int):
    base = [t for p in prompt_ids(TINY_QWEN3) for t in p]
    return (base * (n // len(base) + 1))[:n]


@pytest.mark.parametrize("overlap", [False, True], ids=["plain", "overlap"])
def test_a_long_prompt_beside_running_decodes_and_a_short_arrival(overlap, hf_refs):
    budget = 8
    llm = build_llm(TINY_QWEN3, max_extend_tokens=budget, max_running_reqs=8, page_size=4, overlap=overlap)
    decoding = [(p, SamplingParams(max_tokens=40, ignore_eos=True)) for p in prompt_ids(TINY_QWEN3)[:2]]
    long_prompt, short = _long_prompt(48), prompt_ids(TINY_QWEN3)[1][:3]
    # the decodes start, the long prompt arrives, then a short prompt while it is being chunked
    d0, d1, lng = _run_with_arrivals(llm, decoding, [(long_prompt, SamplingParams(max_tokens=2))], arrive_after=2)[:3]
    llm.assert_all_free()
    trace = llm.trace
    chunk_steps = [t.step for t in trace if t.phase == "prefill" and lng in t.uids]
    assert len(chunk_steps) >= 48 // budget
    # while the long prompt is half done, the running requests get a token at least every other step
    window = [t for t in trace if chunk_steps[0] <= t.step <= chunk_steps[-1]]
    for a, b in zip(window, window[1:]):
        assert a.phase == "decode" or b.phase == "decode", f"steps {a.step} and {b.step} both prefill"
    assert all({d0, d1} <= set(t.uids) for t in window if t.phase == "decode")
    for uid, (ids, sp) in zip((d0, d1), decoding):
        assert llm.take_output(uid).token_ids == hf_refs.get(TINY_QWEN3, ids, sp.max_tokens, stop_at_eos=False)
    assert llm.take_output(lng).token_ids == hf_refs.get(TINY_QWEN3, long_prompt, 2)

    # again, with a short prompt arriving once the long one is in its chunks
    llm = build_llm(TINY_QWEN3, max_extend_tokens=budget, max_running_reqs=8, page_size=4, overlap=overlap)
    lng, sht = _run_with_arrivals(llm, [(long_prompt, SamplingParams(max_tokens=2))], [(short, SamplingParams(max_tokens=2))], arrive_after=2)
    llm.assert_all_free()
    prefills = [t for t in llm.trace if t.phase == "prefill"]
    long_done = max(t.step for t in prefills if lng in t.uids)
    short_steps = [t.step for t in llm.trace if sht in t.uids]
    # it joined a chunk's batch whole, and was finished (both tokens) before the long prompt's prefill ended
    joined = next(t for t in prefills if sht in t.uids)
    assert lng in joined.uids and joined.extend_lens[joined.uids.index(sht)] == len(short)
    assert max(short_steps) < long_done
    assert all(sum(t.extend_lens) <= budget for t in prefills)
    assert llm.take_output(sht).token_ids == hf_refs.get(TINY_QWEN3, short, 2)
    assert llm.take_output(lng).token_ids == hf_refs.get(TINY_QWEN3, long_prompt, 2)


def test_a_newcomer_longer_than_half_the_budget_waits_for_the_chunk():
    """Only one prompt is cut at a time, so a waiting prompt that does not fit whole beside the
    chunk waits, and the chunk then takes the whole budget."""
    llm = build_llm(TINY_QWEN3, max_extend_tokens=8, max_running_reqs=4)
    long_prompt, other = _long_prompt(40), _long_prompt(20)
    lng, oth = _run_with_arrivals(llm, [(long_prompt, SamplingParams(max_tokens=1))], [(other, SamplingParams(max_tokens=1))], arrive_after=1)
    llm.assert_all_free()
    prefills = [t for t in llm.trace if t.phase == "prefill"]
    assert [t.extend_lens for t in prefills if lng in t.uids] == [[8]] * 5
    first_other = next(i for i, t in enumerate(prefills) if oth in t.uids)
    assert prefills[first_other - 1].uids == [lng] and prefills[first_other].uids[0] == oth
