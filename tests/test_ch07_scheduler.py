"""Chapter 7, the scheduler and the offline LLM.

Claims: `LLM.generate` returns transformers' greedy tokens for every architecture, also when
more requests arrive than there are table rows (continuous batching: requests join and leave
the running batch between steps); requests that can never run are refused up front with an
`InvalidRequestError` that names the limit and a fix that is accepted when followed, and leave
nothing allocated; seeded sampling is reproducible and independent of the batch a request lands
in; degenerate sampling is greedy.

Chapter 7's own `Scheduler`, without the mixins later chapters stack on it: prompts join whole
(the first of a batch whatever its length), each batch is read before the next is picked, and its
tokens equal transformers'. Its admission (`PrefillAdder.admit`) keeps the contract the chapter
states: a free row, the budget for the whole prompt, pages to the end on top of the promises;
a refusal changes nothing. The queue passes over a request that does not fit, at most
`MAX_PASSED_OVER` times. Later ideas stack over `Scheduler` in registration order.
"""

from __future__ import annotations

import json
import re
import shutil

import pytest

from helpers import (
    needs_real_smollm2,
    MAX_TOKENS,
    SMOLLM2,
    TINY_LLAMA,
    TINY_QWEN2,
    TINY_QWEN3,
    build_llm,
    generate_ids,
    prompt_ids,
    small_engine_kwargs,
)
from minisgl.core import InvalidRequestError, SamplingParams
from minisgl.engine import EngineConfig
from minisgl.llm import LLM
from minisgl.scheduler import Scheduler, SchedulerConfig


@pytest.mark.parametrize("path", [TINY_LLAMA, TINY_QWEN2, TINY_QWEN3], ids=lambda p: p.name)
def test_generate_matches_transformers_greedy(path, hf_refs):
    """Built with keyword arguments: `LLM(path, page_size=..., max_running_reqs=...)`."""
    llm = LLM(str(path), **small_engine_kwargs(page_size=1, max_running_reqs=8))
    prompts = prompt_ids(path)
    expected = [hf_refs.get(path, p, n) for p, n in zip(prompts, MAX_TOKENS)]
    assert generate_ids(llm, prompts, MAX_TOKENS) == expected


def test_config_route_and_keyword_overrides_agree():
    """`LLM(config=SchedulerConfig(engine=EngineConfig(...)))`, with keywords overriding engine fields."""
    engine = EngineConfig(model_path=str(TINY_LLAMA), **small_engine_kwargs(page_size=1))
    llm = LLM(config=SchedulerConfig(engine=engine, prefix_cache="naive", overlap=False), page_size=4, max_running_reqs=3)
    assert (llm.config.engine.page_size, llm.config.engine.max_running_reqs) == (4, 3)
    assert llm.config.prefix_cache == "naive" and not llm.config.overlap
    assert llm.engine.page_size == 4 and llm.table.max_running_reqs == 3


@pytest.fixture(scope="module")
def smol():
    """SmolLM2 with two table rows, so eight prompts must take turns."""
    return build_llm(SMOLLM2, prefix_cache="naive", max_running_reqs=2)


def test_continuous_batching_with_more_requests_than_rows(smol, hf_refs):
    prompts = prompt_ids()
    smol.trace.clear()
    got = generate_ids(smol, prompts, MAX_TOKENS)
    assert got == [hf_refs.get(SMOLLM2, p, n) for p, n in zip(prompts, MAX_TOKENS)]
    assert max(len(t.uids) for t in smol.trace) == 2  # never more running than rows
    phases = [t.phase for t in smol.trace]
    first_decode = phases.index("decode")
    assert "prefill" in phases[first_decode:], "new requests should join while others decode"
    # every request is prefilled exactly once (no chunking here) and in arrival order
    prefilled = [uid for t in smol.trace if t.phase == "prefill" for uid in t.uids]
    assert prefilled == sorted(prefilled) and len(prefilled) == len(prompts)


def test_results_come_back_in_prompt_order_with_finish_reasons(smol):
    # ignore_eos: the claim is about order and the length limit, whatever the weights predict
    outs = smol.generate([[504, 3575], [28]], [SamplingParams(max_tokens=2, ignore_eos=True), SamplingParams(max_tokens=1, ignore_eos=True)])
    smol.assert_all_free()
    assert [o.prompt_ids for o in outs] == [[504, 3575], [28]]
    assert [len(o.token_ids) for o in outs] == [2, 1]
    assert all(o.finish_reason == "length" for o in outs)
    assert outs[0].text == smol.tokenizer.decode(outs[0].token_ids, skip_special_tokens=True)


@needs_real_smollm2
def test_chat_prompt_stops_at_eos_with_reason_stop(smol, hf_refs):
    question = "What is 2+2? Answer with just the number."
    ids = smol.encode(question, chat=True)
    expected = hf_refs.get(SMOLLM2, ids, 20)
    assert expected[-1] in smol.eos_ids and len(expected) < 20  # the oracle itself stops early
    out = smol.generate([question], SamplingParams(max_tokens=20), chat=True)[0]
    smol.assert_all_free()
    assert out.prompt_ids == ids and out.token_ids == expected and out.finish_reason == "stop"


def test_stop_token_ids_and_ignore_eos(smol, hf_refs):
    prompt = prompt_ids()[3]  # "1, 2, 3," -> " 4, 5, ..."
    ref = hf_refs.get(SMOLLM2, prompt, 6)
    stop = ref[2]
    out = smol.generate([prompt], SamplingParams(max_tokens=6, stop_token_ids=(stop,)))[0]
    # the first time the stop token appears ends the request, and it is kept as the last token
    assert out.token_ids == ref[: ref.index(stop) + 1] and out.finish_reason == "stop"
    question = smol.encode("What is 2+2? Answer with just the number.", chat=True)
    n = len(hf_refs.get(SMOLLM2, question, 20))
    out = smol.generate([question], SamplingParams(max_tokens=n + 2, ignore_eos=True))[0]
    assert len(out.token_ids) == n + 2 and out.finish_reason == "length"
    smol.assert_all_free()


# ---- requests that can never run ---------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny():
    return build_llm(TINY_QWEN3, max_seq_len=64, num_pages=40, page_size=4)


def test_prompt_longer_than_the_context_is_refused_naming_the_limit(tiny):
    with pytest.raises(InvalidRequestError, match="context is 64 tokens"):
        tiny.generate([list(range(100, 170))], SamplingParams(max_tokens=1))
    with pytest.raises(InvalidRequestError, match="max_tokens to at most 4"):
        tiny.generate([list(range(100, 160))], SamplingParams(max_tokens=8))
    tiny.assert_all_free()


def test_prompt_longer_than_the_model_context_is_refused():
    """Without a max_seq_len setting the limit is the model's own context (2048 for tiny-qwen3)."""
    llm = LLM(str(TINY_QWEN3), **small_engine_kwargs(max_seq_len=None))
    with pytest.raises(InvalidRequestError, match="prompt has 2049 tokens .* context is 2048 tokens"):
        llm.generate([[7] * 2049], SamplingParams(max_tokens=1))
    llm.assert_all_free()


def test_request_larger_than_the_kv_pool_is_refused(tiny):
    small = build_llm(TINY_QWEN3, max_seq_len=64, num_pages=4, page_size=4)  # 16 tokens of KV
    with pytest.raises(InvalidRequestError, match="KV pool holds 16 tokens"):
        small.generate([list(range(100, 120))], SamplingParams(max_tokens=2))
    small.assert_all_free()


def _follow(message: str, n: int, max_tokens: int) -> tuple[int, int]:
    """The (prompt length, max_tokens) a user who does what `message` says would send next."""
    if m := re.search(r"lower max_tokens to at most (\d+)", message):
        return n, int(m.group(1))
    if m := re.search(r"shorten the prompt to at most (\d+) tokens", message):
        return int(m.group(1)), max_tokens
    m = re.search(r"together they are at most (\d+)", message)
    assert m, f"the refusal names no fix: {message}"
    return int(m.group(1)) - 1, 1


CONTEXT_64 = {"max_seq_len": 64, "num_pages": 64, "page_size": 4}  # the context is the limit
POOL_16 = {"max_seq_len": 64, "num_pages": 4, "page_size": 4}  # 16 tokens of KV are the limit


@pytest.mark.parametrize("limits,n,max_tokens", [
    (CONTEXT_64, 60, 10), (CONTEXT_64, 64, 8), (CONTEXT_64, 70, 70),
    (POOL_16, 20, 2), (POOL_16, 10, 30), (POOL_16, 17, 17),
])
def test_every_refusal_of_a_long_request_names_a_fix_that_is_accepted(limits, n, max_tokens):
    llm = build_llm(TINY_QWEN3, **limits)
    with pytest.raises(InvalidRequestError) as refused:
        llm.validate(list(range(100, 100 + n)), SamplingParams(max_tokens=max_tokens))
    n2, max2 = _follow(str(refused.value), n, max_tokens)
    assert n2 >= 1 and max2 >= 1
    out = llm.generate([list(range(100, 100 + n2))], SamplingParams(max_tokens=max2, ignore_eos=True))
    assert len(out[0].token_ids) == max2
    llm.assert_all_free()


def test_empty_prompt_is_refused(tiny):
    with pytest.raises(InvalidRequestError, match="empty"):
        tiny.generate([[]], SamplingParams(max_tokens=2))
    tiny.assert_all_free()


@pytest.mark.parametrize("max_tokens", [0, -1])
def test_non_positive_max_tokens_is_refused(max_tokens):
    with pytest.raises(InvalidRequestError, match=f"max_tokens must be a positive integer, got {max_tokens}"):
        SamplingParams(max_tokens=max_tokens)


def test_one_bad_prompt_refuses_the_whole_call_before_anything_runs(tiny):
    steps = len(tiny.trace)
    with pytest.raises(InvalidRequestError, match="empty"):
        tiny.generate([[5, 6, 7], []], SamplingParams(max_tokens=2))
    assert len(tiny.trace) == steps and tiny.is_idle
    tiny.assert_all_free()
    assert tiny.generate([[5, 6, 7]], SamplingParams(max_tokens=2))[0].finish_reason == "length"


def test_add_request_validates_too(tiny):
    with pytest.raises(InvalidRequestError, match="empty"):
        tiny.add_request([], SamplingParams())
    assert tiny.is_idle
    tiny.assert_all_free()


def test_prompt_as_a_single_string_is_a_type_error(tiny):
    with pytest.raises(TypeError, match="list of prompts"):
        tiny.generate("hello")  # type: ignore[arg-type]


def test_unknown_architecture_is_refused_by_llm(tmp_path):
    for f in TINY_LLAMA.iterdir():
        shutil.copy(f, tmp_path / f.name)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["architectures"] = ["NotARealModelForCausalLM"]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="NotARealModelForCausalLM.*supported"):
        LLM(str(tmp_path), **small_engine_kwargs())


@pytest.mark.parametrize("page_size", [3, 0])
def test_bad_page_size_is_refused_by_llm(page_size):
    with pytest.raises(ValueError, match="page_size must be a power of two"):
        LLM(str(TINY_QWEN3), **small_engine_kwargs(page_size=page_size))


def test_bad_scheduler_settings_are_refused():
    engine = EngineConfig(model_path=str(TINY_QWEN3))
    with pytest.raises(ValueError, match="prefix_cache"):
        SchedulerConfig(engine=engine, prefix_cache="lru")
    with pytest.raises(ValueError, match="max_extend_tokens"):
        SchedulerConfig(engine=engine, max_extend_tokens=0)


# ---- sampling through the whole engine -----------------------------------------------------------


@pytest.fixture(scope="module")
def sampler_llm():
    # a random-weight model: its next-token distribution is nearly flat, so sampling varies a lot
    return build_llm(TINY_LLAMA, max_running_reqs=4)


def _sampled(llm, prompts, params):
    outs = llm.generate(prompts, params)
    llm.assert_all_free()
    return [o.token_ids for o in outs]


def test_seeded_sampling_is_reproducible_across_runs_and_engines(sampler_llm):
    prompts = prompt_ids(TINY_LLAMA)[:3]
    params = [SamplingParams(max_tokens=8, temperature=1.0, seed=s) for s in (1, 2, 3)]
    first = _sampled(sampler_llm, prompts, params)
    assert _sampled(sampler_llm, prompts, params) == first
    fresh = build_llm(TINY_LLAMA, max_running_reqs=2, page_size=4)
    assert _sampled(fresh, prompts, params) == first
    assert len({tuple(t) for t in first}) == 3
    other = _sampled(sampler_llm, prompts, [SamplingParams(max_tokens=8, temperature=1.0, seed=s) for s in (4, 5, 6)])
    assert other != first  # the seed matters


def test_seeded_sampling_does_not_depend_on_batch_composition(sampler_llm):
    prompts = prompt_ids(TINY_LLAMA)
    mine = SamplingParams(max_tokens=8, temperature=0.9, top_k=50, top_p=0.9, seed=77)
    alone = _sampled(sampler_llm, [prompts[2]], [mine])[0]
    crowd = [SamplingParams(max_tokens=n, temperature=1.3, seed=i) for i, n in enumerate([3, 9, 5])]
    together = _sampled(sampler_llm, [prompts[0], prompts[5], prompts[2], prompts[7]], [crowd[0], crowd[1], mine, crowd[2]])
    assert together[2] == alone


@pytest.mark.parametrize(
    "params",
    [dict(temperature=0.0, seed=3), dict(temperature=1.0, top_k=1, seed=3), dict(temperature=1.0, top_p=1e-6, seed=3)],
    ids=["temperature=0", "top_k=1", "top_p=tiny"],
)
def test_degenerate_sampling_equals_greedy(sampler_llm, hf_refs, params):
    prompts = prompt_ids(TINY_LLAMA)[:4]
    got = _sampled(sampler_llm, prompts, [SamplingParams(max_tokens=6, **params)] * 4)
    assert got == [hf_refs.get(TINY_LLAMA, p, 6) for p in prompts]


# ---- chapter 7's Scheduler alone -----------------------------------------------------------------


class PlainScheduler(Scheduler):
    """The base `Scheduler` with no later chapter's mixin, collecting tokens through `on_token`."""

    def __init__(self, config: SchedulerConfig):
        super().__init__(config)
        self.tokens: dict = {}

    def on_token(self, req, token, finish_reason):
        if token is not None:
            self.tokens.setdefault(req.uid, []).append(token)

    def run(self, prompts, max_tokens):
        uids = [self.add_request(p, SamplingParams(max_tokens=n)) for p, n in zip(prompts, max_tokens)]
        while not self.is_idle:
            self.step()
            # each batch is read before the next is picked: every live request's host tokens
            # have caught up with its lengths, and the trace has one entry per step
            assert all(len(r.input_ids) == r.device_len for r in self.live.values())
        self.assert_all_free()
        return [self.tokens[u] for u in uids]


def plain_scheduler(budget: int) -> PlainScheduler:
    engine = EngineConfig(model_path=str(TINY_LLAMA), **small_engine_kwargs(page_size=4, max_seq_len=64))
    return PlainScheduler(SchedulerConfig(engine=engine, prefix_cache="naive", max_extend_tokens=budget,
                                          check_integrity=True))


def test_the_plain_scheduler_takes_whole_prompts_and_matches_transformers(hf_refs):
    sched = plain_scheduler(budget=8)
    prompts = [[(7 * i + k) % 200 + 3 for i in range(n)] for k, n in enumerate([3, 4, 5, 1, 30, 2])]
    got = sched.run(prompts, [4] * len(prompts))
    assert got == [hf_refs.get(TINY_LLAMA, p, 4) for p in prompts]
    # 3 + 4 fit the budget of 8; 5 does not fit beside them and leads the next step, and the 1 behind
    # it waits with it although it would fit (no one jumps the queue); the 30-token prompt is more
    # than the whole budget and still joins whole, alone, as its step's first prompt
    assert [t.extend_lens for t in sched.trace if t.phase == "prefill"] == [[3, 4], [5, 1], [30], [2]]


def test_chapter_7_llm_is_the_scheduler_with_the_registered_mixins_on_top():
    from minisgl.scheduler import scheduler_bases

    assert LLM.__bases__ == scheduler_bases() and scheduler_bases()[-1] is Scheduler


def test_a_mixin_registered_later_overrides_those_before_and_a_name_registers_once():
    from minisgl.scheduler import scheduler as sched_mod
    from minisgl.scheduler import extends_scheduler, scheduler_bases, scheduler_extensions

    saved = list(sched_mod._EXTENSIONS)
    try:
        @extends_scheduler("first")
        class First:
            def sampling_plan(self, batch, bitmask=None):
                return ("first", super().sampling_plan(batch, bitmask))

        @extends_scheduler("second")
        class Second:
            def sampling_plan(self, batch, bitmask=None):
                return ("second", super().sampling_plan(batch, bitmask))

        assert scheduler_extensions()[-2:] == ["first", "second"]
        bases = scheduler_bases()
        assert bases[:2] == (Second, First) and bases[-1] is Scheduler
        stacked = type("Stacked", bases, {})
        assert stacked.__mro__.index(Second) < stacked.__mro__.index(First) < stacked.__mro__.index(Scheduler)

        @extends_scheduler("first")
        class FirstAgain:
            pass

        assert scheduler_extensions().count("first") == 1 and scheduler_bases()[0] is FirstAgain
    finally:
        sched_mod._EXTENSIONS[:] = saved


# ---- admission: the contract chapter 7 states, on the chapter's own example --------------------


def _adder(rows=2, pages=12, page_size=4, budget=16, reserved=5):
    import torch

    from minisgl.scheduler.pages import PageAllocator
    from minisgl.scheduler.prefill import PrefillAdder
    from minisgl.scheduler.table import TableManager

    page_table = torch.full((rows + 1, 64), -1, dtype=torch.int32)
    return PrefillAdder(budget, reserved, TableManager(rows, page_table), PageAllocator(pages, page_size, page_table))


def _offer(adder, uid, prompt_len, max_tokens):
    import torch

    from minisgl.scheduler.prefill import PendingReq

    ids = torch.arange(1, prompt_len + 1, dtype=torch.int32)
    before = (adder.token_budget, adder.spent, adder.reserved_pages, adder.table.available_size)
    req = adder.try_admit(PendingReq(uid, ids, SamplingParams(max_tokens=max_tokens), 0))
    if req is None:  # a refusal changes nothing
        assert (adder.token_budget, adder.spent, adder.reserved_pages, adder.table.available_size) == before
        return None
    # admitted whole, with its prompt in its row of the token pool, and its pages to the end promised
    assert req.extend_len == prompt_len and req.cached_len == 0 and not req.is_chunk
    assert torch.equal(adder.table.token_pool[req.table_idx, :prompt_len], ids)
    assert adder.reserved_pages - before[2] == adder.cache.pages_to_finish(req) == -(-(prompt_len + max_tokens - 1) // 4)
    assert (before[0] - adder.token_budget, adder.spent - before[1]) == (prompt_len, prompt_len)
    assert adder.table.available_size == before[3] - 1
    return req


def test_admission_needs_a_row_the_budget_for_the_whole_prompt_and_pages_to_the_end():
    adder = _adder()  # the chapter's example: 2 rows, 12 pages of 4, budget 16, 5 pages promised
    admitted = [_offer(adder, uid, n, g) is not None for uid, (n, g) in enumerate([(6, 10), (12, 2), (4, 16), (4, 4),
                                                                                  (2, 2)])]
    # uid1: 12 tokens > the 10 left; uid2: 5 pages to its end, 12 - 9 promised left; uid4: no row
    assert admitted == [True, False, False, True, False]
    assert (adder.token_budget, adder.spent, adder.reserved_pages, adder.table.available_size) == (6, 10, 11, 0)


def test_the_first_prompt_of_a_batch_joins_whatever_its_length():
    adder = _adder(budget=16, reserved=0)
    assert _offer(adder, 0, 40, 2) is not None and adder.token_budget == -24
    assert _offer(adder, 1, 1, 1) is None  # the budget is spent: nothing else joins this step


# ---- admission order: passing over a request that does not fit, a bounded number of times ------


def _manager(rows: int):
    """A chapter-7 `PrefillManager` over 12 pages of 4 tokens (the adder's example pool)."""
    from minisgl.scheduler.prefill import PrefillManager

    adder = _adder(rows=rows)
    return PrefillManager(adder.table, adder.cache, max_extend_tokens=16)


def _pending(uid: int, max_tokens: int):
    import torch

    from minisgl.scheduler.prefill import PendingReq

    return PendingReq(uid, torch.arange(1, 5, dtype=torch.int32), SamplingParams(max_tokens=max_tokens), 0)


def test_a_request_that_fits_is_not_held_behind_ones_that_do_not():
    pm = _manager(rows=4)
    big = [_pending(0, 20), _pending(1, 20)]  # 6 pages each to their end: 4 are free beside 8 promised
    for p in [*big, _pending(2, 4)]:  # a short request (2 pages) behind them
        pm.add(p)
    batch = pm.schedule_next_batch(reserved_pages=8)
    assert batch is not None and [r.uid for r in batch.reqs] == [2]
    assert [p.uid for p in pm.pending] == [0, 1] and [p.passed_over for p in big] == [1, 1]


def test_a_request_passed_over_enough_times_lets_nothing_ahead_of_it_until_it_fits():
    from minisgl.scheduler.prefill import MAX_PASSED_OVER

    pm = _manager(rows=MAX_PASSED_OVER + 3)
    big = _pending(0, 20)
    pm.add(big)
    for uid in range(1, MAX_PASSED_OVER + 1):  # a short request arrives each step and goes past it
        pm.add(_pending(uid, 4))
        batch = pm.schedule_next_batch(reserved_pages=8)
        assert batch is not None and [r.uid for r in batch.reqs] == [uid]
    assert big.passed_over == MAX_PASSED_OVER
    pm.add(_pending(99, 4))
    assert pm.schedule_next_batch(reserved_pages=8) is None  # the short one would fit, but waits behind it
    assert [p.uid for p in pm.pending] == [0, 99]
    batch = pm.schedule_next_batch(reserved_pages=0)  # running requests finished: it fits, first
    assert [r.uid for r in batch.reqs] == [0, 99]
