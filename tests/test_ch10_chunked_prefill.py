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
        assert sum(n for _, n, _ in steps) == len(p)  # each prompt token computed exactly once
        assert [c for _, _, c in steps] == [sum(n for _, n, _ in steps[:i]) for i in range(len(steps))]
        assert len(steps) >= -(-len(p) // budget)


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
