"""Chapter 10, chunked prefill: a mixin over chapter 7's scheduler.

Claims: chapter 7's `Scheduler` computes a prompt whole, over the budget if need be, and
`ChunkedPrefillMixin` (in every scheduler built from `scheduler_bases()`) cuts it, with the same
tokens; no prefill step computes more than `max_extend_tokens` tokens; a long prompt is cut into
chunks that continue first in the next steps and add up to exactly its uncached part; nothing is
sampled from a chunk; and the tokens are still transformers' (with and without a prefix hit).
What a short prompt waits for, exactly: while a prompt is half done, the prompt at the head of
the queue joins the next prefill step whole if it is at most half the budget (a row and pages
free), and the half-done one still advances by at least the other half; further back, a prompt
waits for those ahead of it, and behind one longer than half the budget, until the chunk is done.
"""

from __future__ import annotations

import pytest

import random

from helpers import MAX_TOKENS, SMOLLM2, TINY_QWEN3, build_llm, generate_ids, prompt_ids, small_engine_kwargs
from minisgl.core import SamplingParams


def _prefill_steps(trace, uid):
    return [(t.step, t.extend_lens[t.uids.index(uid)], t.cached_lens[t.uids.index(uid)]) for t in trace
            if t.phase == "prefill" and uid in t.uids]


def test_chapter_7s_scheduler_computes_a_prompt_whole_and_the_mixin_cuts_it(hf_refs):
    from minisgl.engine import EngineConfig
    from minisgl.llm import LLM
    from minisgl.scheduler import ChunkedPrefillMixin, Scheduler, SchedulerConfig

    assert ChunkedPrefillMixin in LLM.__mro__ and ChunkedPrefillMixin not in Scheduler.__mro__
    config = SchedulerConfig(engine=EngineConfig(model_path=str(TINY_QWEN3), **small_engine_kwargs()),
                             prefix_cache="naive", overlap=False, max_extend_tokens=7)
    long_prompt = prompt_ids(TINY_QWEN3)[4]  # 34 tokens
    tokens = []
    whole = Scheduler(config)
    whole.on_token = lambda req, token, reason: token is not None and tokens.append(token)
    whole.add_request(long_prompt, SamplingParams(max_tokens=3))
    while not whole.is_idle:
        whole.step()
    whole.assert_all_free()
    assert [t.extend_lens for t in whole.trace if t.phase == "prefill"] == [[34]]  # one step, over the budget
    cut = LLM(config=config)
    out = cut.generate([long_prompt], SamplingParams(max_tokens=3))[0]
    cut.assert_all_free()
    assert [t.extend_lens for t in cut.trace if t.phase == "prefill"] == [[7], [7], [7], [7], [6]]
    assert tokens == out.token_ids == hf_refs.get(TINY_QWEN3, long_prompt, 3)


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


def test_a_short_prompt_behind_a_long_waiting_one_waits_for_the_whole_chunk():
    """Arrival order is kept: a 3-token prompt behind one longer than half the budget is not
    admitted beside the chunk, however short it is."""
    llm = build_llm(TINY_QWEN3, max_extend_tokens=8, max_running_reqs=4, prefix_cache="naive")
    long_prompt, other, short = _long_prompt(40), _long_prompt(20), prompt_ids(TINY_QWEN3)[1][:3]
    lng, oth, sht = _run_with_arrivals(llm, [(long_prompt, SamplingParams(max_tokens=1))],
                                       [(other, SamplingParams(max_tokens=1)), (short, SamplingParams(max_tokens=1))],
                                       arrive_after=1)
    llm.assert_all_free()
    prefills = [t for t in llm.trace if t.phase == "prefill"]
    assert min(t.step for t in prefills if sht in t.uids) > max(t.step for t in prefills if lng in t.uids)


def _record_queue(llm):
    """Before each step: (steps so far, the head of the queue, a prompt half done?, free rows)."""
    log = []
    step = llm.step

    def recording() -> None:
        head = llm.prefill.pending[0] if llm.prefill.pending else None
        chunk = llm.prefill.chunked
        log.append((len(llm.trace), head, chunk and (chunk.uid, chunk.prompt_len - chunk.cached_len),
                    llm.table.available_size))
        step()

    llm.step = recording
    return log


@pytest.mark.parametrize("seed", range(3))
def test_at_the_head_of_the_queue_a_short_prompt_joins_the_next_prefill_step(seed):
    """Chapter 10's claim, as the code guarantees it, on random prompts, budgets and arrivals."""
    rng = random.Random(seed)
    budget = rng.choice([6, 8, 11])
    llm = build_llm(TINY_QWEN3, max_extend_tokens=budget, max_running_reqs=4, prefix_cache="naive", num_pages=2048)
    log = _record_queue(llm)
    arrivals = {}
    for _ in range(14):
        n = rng.choice([rng.randrange(1, budget // 2 + 1), rng.randrange(budget, 5 * budget)])
        prompt = [rng.randrange(10, 1000) for _ in range(n)]
        arrivals.setdefault(rng.randrange(0, 30), []).append((prompt, SamplingParams(max_tokens=rng.randrange(1, 6))))
    step = 0
    while step <= max(arrivals) or not llm.is_idle:
        for prompt, params in arrivals.get(step, []):
            llm.add_request(prompt, params)
        llm.step()
        step += 1
    llm.assert_all_free()
    beside_a_chunk = 0
    for before, head, chunk, free_rows in log:
        if len(llm.trace) <= before or llm.trace[before].phase != "prefill":
            continue  # this turn launched nothing, or a decode step
        t = llm.trace[before]
        if chunk is not None:  # the half-done prompt goes first, with at least the other half of the budget
            uid, rest = chunk
            assert t.uids[0] == uid and t.extend_lens[0] >= min(rest, budget - budget // 2)
        if head is not None and free_rows > 0 and (chunk is None or len(head.input_ids) <= budget // 2):
            assert head.uid in t.uids, f"step {t.step}: the head of the queue, uid{head.uid}, waited"
            beside_a_chunk += chunk is not None
    assert beside_a_chunk > 0, "no short prompt reached the head of the queue beside a chunk: the test proves nothing"
