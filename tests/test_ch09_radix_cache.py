"""Chapter 9, the radix prefix cache.

Claims: a stored token sequence is found again by any request that starts with it (whole pages
only); a partial match splits an edge; locked paths are never evicted; eviction drops unlocked
leaves least recently used first; the integrity check really catches a corrupted tree. End to end,
a prompt sharing a prefix with an earlier request reuses exactly the page-aligned shared part
and still generates transformers' tokens. A prompt enters the cache when its prefill is launched:
prompts that share an uncached prefix in one batch compute it once (the others wait a step and
reuse it), and two requests that did compute the same tokens keep one copy.
"""

from __future__ import annotations

import pytest
import torch

from helpers import SHARED_PREFIX, SMOLLM2, TINY_QWEN3, build_llm, encode, prompt_ids
from minisgl.core import SamplingParams
from minisgl.kvcache import RadixPrefixCache
from minisgl.scheduler.prefix import SHARED_PREFIX_WAIT

CPU = torch.device("cpu")


def ids(*tokens: int) -> torch.Tensor:
    return torch.tensor(tokens, dtype=torch.int32)


def slots(start: int, n: int) -> torch.Tensor:
    return torch.arange(start, start + n, dtype=torch.int32)


def test_insert_then_match_returns_the_stored_slots():
    cache = RadixPrefixCache(1, CPU)
    assert cache.insert_prefix(ids(1, 2, 3, 4), slots(100, 4)) == 0  # nothing was there before
    handle, found = cache.match_prefix(ids(1, 2, 3, 4, 5, 6))
    assert handle.cached_len == 4 and found.tolist() == [100, 101, 102, 103]
    handle, found = cache.match_prefix(ids(1, 2))
    assert handle.cached_len == 2 and found.tolist() == [100, 101]
    handle, found = cache.match_prefix(ids(9, 1, 2))
    assert handle.cached_len == 0 and len(found) == 0
    cache.check_integrity()


def test_partial_match_splits_the_edge_and_insert_adds_a_branch():
    cache = RadixPrefixCache(1, CPU)
    cache.insert_prefix(ids(1, 2, 3, 4), slots(100, 4))
    handle, found = cache.match_prefix(ids(1, 2, 9))
    assert handle.cached_len == 2 and found.tolist() == [100, 101]
    assert len(cache.root.children) == 1 and len(next(iter(cache.root.children.values()))) == 2  # split at 2
    assert cache.insert_prefix(ids(1, 2, 9, 9), slots(200, 4)) == 2  # the first two were already there
    cache.check_integrity()
    assert cache.size == 6  # 1 2 | 3 4 | 9 9: the duplicate slots 200, 201 were not taken
    assert cache.match_prefix(ids(1, 2, 9, 9))[1].tolist() == [100, 101, 202, 203]
    assert cache.to_text().count("\n") == 2  # three edges


def test_page_size_four_matches_whole_pages_only():
    cache = RadixPrefixCache(4, CPU)
    with pytest.raises(AssertionError):
        cache.insert_prefix(ids(1, 2, 3), slots(0, 3))  # not a whole page
    cache.insert_prefix(ids(*range(1, 9)), slots(40, 8))
    assert cache.match_prefix(ids(*range(1, 8)))[0].cached_len == 4  # 7 tokens: one whole page
    assert cache.match_prefix(ids(1, 2, 3, 4, 5, 6, 0, 8, 9))[0].cached_len == 4  # diverges inside page 2
    assert cache.match_prefix(ids(1, 2, 3, 0))[0].cached_len == 0
    handle, found = cache.match_prefix(ids(*range(1, 12)))
    assert handle.cached_len == 8 and found.tolist() == list(range(40, 48))
    for node in cache._nodes():
        assert len(node) % 4 == 0
    cache.check_integrity()


def test_locks_protect_a_path_and_split_keeps_them():
    cache = RadixPrefixCache(1, CPU)
    cache.insert_prefix(ids(1, 2, 3, 4), slots(0, 4))
    handle, _ = cache.match_prefix(ids(1, 2, 3, 4))
    cache.lock_handle(handle)
    assert (cache.protected_size, cache.evictable_size) == (4, 0)
    cache.match_prefix(ids(1, 2, 7))  # splits the locked edge
    cache.check_integrity()
    assert cache.protected_size == 4
    assert len(cache.evict(100)) == 0  # nothing unlocked to evict
    cache.lock_handle(handle, unlock=True)
    assert (cache.protected_size, cache.evictable_size) == (0, 4)
    with pytest.raises(AssertionError, match="unlock without a matching lock"):
        cache.lock_handle(handle, unlock=True)


def test_evict_drops_least_recently_used_leaves_first():
    cache = RadixPrefixCache(1, CPU)
    cache.insert_prefix(ids(1, 1), slots(10, 2))  # A
    cache.insert_prefix(ids(2, 2), slots(20, 2))  # B
    cache.insert_prefix(ids(3, 3), slots(30, 2))  # C
    cache.match_prefix(ids(1, 1))  # touch A: now B is the oldest
    assert cache.evict(1).tolist() == [20, 21]
    assert cache.evict(2).tolist() == [30, 31]
    assert cache.evict(2).tolist() == [10, 11]
    assert cache.size == 0 and len(cache.evict(1)) == 0


def test_evicting_the_last_child_makes_the_parent_evictable():
    cache = RadixPrefixCache(1, CPU)
    cache.insert_prefix(ids(1, 2, 3), slots(0, 3))
    cache.insert_prefix(ids(1, 2, 4), slots(10, 3))  # splits into [1 2] -> [3], [4]
    freed = cache.evict(5)
    assert sorted(freed.tolist()) == [0, 1, 2, 12]
    assert cache.size == 0
    cache.check_integrity()


def test_locked_child_keeps_its_parent_in_the_tree():
    cache = RadixPrefixCache(1, CPU)
    cache.insert_prefix(ids(1, 2, 3), slots(0, 3))
    cache.insert_prefix(ids(1, 2, 4), slots(10, 3))
    handle, _ = cache.match_prefix(ids(1, 2, 3))
    cache.lock_handle(handle)
    assert cache.evict(100).tolist() == [12]  # only the unlocked leaf [4] can go
    assert cache.match_prefix(ids(1, 2, 3))[0].cached_len == 3


# ---- the integrity check is not a no-op ---------------------------------------------------------


def _populated() -> RadixPrefixCache:
    cache = RadixPrefixCache(1, CPU)
    cache.insert_prefix(ids(1, 2, 3), slots(0, 3))
    cache.insert_prefix(ids(1, 2, 4, 5), slots(10, 4))
    cache.check_integrity()
    return cache


def _child(cache, *path):
    node = cache.root
    for token in path:
        node = node.children[(token,)]
    return node


@pytest.mark.parametrize(
    "corrupt, message",
    [
        (lambda c: setattr(c, "_evictable", c._evictable + 1), "size counters drifted"),
        (lambda c: setattr(_child(c, 1, 4), "ref_count", 1), "parent is not locked"),
        (lambda c: setattr(_child(c, 1, 3), "value", torch.tensor([12], dtype=torch.int32)), "stored twice"),
        (lambda c: _child(c, 1).children.__setitem__((9,), _child(c, 1).children.pop((3,))), "filed"),
        (lambda c: setattr(_child(c, 1, 4), "value", torch.tensor([1], dtype=torch.int32)), "lengths differ"),
    ],
    ids=["size-counter", "unlocked-parent", "duplicate-slot", "misfiled-child", "key-value-mismatch"],
)
def test_integrity_check_catches_a_corrupted_tree(corrupt, message):
    cache = _populated()
    corrupt(cache)
    with pytest.raises(AssertionError, match=message):
        cache.check_integrity()


# ---- end to end -------------------------------------------------------------------------------


def _common(a, b) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


@pytest.mark.parametrize("page_size", [1, 4])
def test_shared_prefix_hits_the_cache_and_still_matches_transformers(page_size, hf_refs):
    llm = build_llm(SMOLLM2, prefix_cache="radix", page_size=page_size)
    first, second, third = prompt_ids()[2], prompt_ids()[4], encode(SHARED_PREFIX + " she")
    out = llm.generate([first], SamplingParams(max_tokens=4))[0]
    llm.assert_all_free()
    assert out.cached_tokens == 0 and out.token_ids == hf_refs.get(SMOLLM2, first, 4)
    outs = llm.generate([second, third, first], SamplingParams(max_tokens=4))
    llm.assert_all_free()
    for prompt, o in zip([second, third], outs):
        shared = _common(first, prompt)
        assert shared > 20
        assert o.cached_tokens == min(shared, len(prompt) - 1) // page_size * page_size
        assert o.token_ids == hf_refs.get(SMOLLM2, prompt, 4)
    # the same prompt again: everything but the last token is reused (whole pages only)
    assert outs[2].cached_tokens == (len(first) - 1) // page_size * page_size
    assert outs[2].token_ids == out.token_ids


def test_generated_tokens_are_cached_too(hf_refs):
    """A follow-up prompt that extends prompt + answer reuses the answer's KV as well."""
    llm = build_llm(TINY_QWEN3, prefix_cache="radix", page_size=1)
    prompt = prompt_ids(TINY_QWEN3)[2]
    out = llm.generate([prompt], SamplingParams(max_tokens=6))[0]
    follow = prompt + out.token_ids + [42, 43]
    again = llm.generate([follow], SamplingParams(max_tokens=3))[0]
    llm.assert_all_free()
    # the last generated token's KV was never computed (it was sampled, not fed back)
    assert again.cached_tokens == len(prompt) + len(out.token_ids) - 1
    assert again.token_ids == hf_refs.get(TINY_QWEN3, follow, 3)


def test_later_arrivals_in_one_call_hit_earlier_ones(hf_refs):
    llm = build_llm(TINY_QWEN3, prefix_cache="radix", page_size=4, max_running_reqs=1)
    prompts = [prompt_ids(TINY_QWEN3)[2], prompt_ids(TINY_QWEN3)[4]]
    outs = llm.generate(prompts, SamplingParams(max_tokens=3))
    llm.assert_all_free()
    assert outs[0].cached_tokens == 0
    assert outs[1].cached_tokens == _common(*prompts) // 4 * 4 > 0
    assert [o.token_ids for o in outs] == [hf_refs.get(TINY_QWEN3, p, 3) for p in prompts]


def test_eviction_under_pressure_keeps_results_right(hf_refs):
    """A pool barely larger than one request: cached prefixes must be evicted to admit new ones."""
    llm = build_llm(TINY_QWEN3, prefix_cache="radix", page_size=4, num_pages=14, max_running_reqs=2)
    prompts = [list(range(300 + 50 * i, 340 + 50 * i)) for i in range(4)]  # 40 tokens = 10 pages each
    for p in prompts:
        out = llm.generate([p], SamplingParams(max_tokens=4))[0]
        llm.assert_all_free()
        assert out.token_ids == hf_refs.get(TINY_QWEN3, p, 4)
    assert llm.cache.prefix_cache.size <= 14 * 4


@pytest.mark.parametrize("page_size", [1, 4])
def test_prompts_sharing_a_prefix_in_one_batch_compute_it_once(page_size, hf_refs):
    """Three prompts arrive together sharing 20+ uncached tokens: the first is prefilled alone and
    cached when launched, the other two wait one step and reuse its whole pages."""
    llm = build_llm(SMOLLM2, prefix_cache="radix", page_size=page_size)
    prompts = [encode(SHARED_PREFIX + s) for s in (" she", " he", " they")]
    outs = llm.generate(prompts, SamplingParams(max_tokens=4))
    llm.assert_all_free()
    assert [t.uids for t in llm.trace if t.phase == "prefill"] == [[0], [1, 2]]
    assert outs[0].cached_tokens == 0
    for p, o in zip(prompts[1:], outs[1:]):
        shared = _common(prompts[0], p)
        assert shared >= SHARED_PREFIX_WAIT and o.cached_tokens == min(shared, len(p) - 1) // page_size * page_size
    assert [o.token_ids for o in outs] == [hf_refs.get(SMOLLM2, p, 4) for p in prompts]


def test_with_the_naive_cache_nobody_waits():
    """Nothing is ever cached, so waiting for another prompt's prefix would only cost a step."""
    llm = build_llm(TINY_QWEN3, prefix_cache="naive")
    llm.generate([list(range(10, 40)) + [i] for i in range(3)], SamplingParams(max_tokens=2))
    llm.assert_all_free()
    assert [len(t.uids) for t in llm.trace if t.phase == "prefill"] == [3]


@pytest.mark.parametrize("page_size", [1, 4])
def test_requests_that_computed_the_same_prompt_keep_one_copy(page_size, hf_refs):
    """Identical prompts shorter than the wait threshold are prefilled side by side. When the step
    is launched the first one's pages enter the cache; the others find them there, point their
    rows at them and free their own, so the cache holds one copy and every page has one owner."""
    llm = build_llm(TINY_QWEN3, prefix_cache="radix", page_size=page_size)
    prompt = list(range(50, 62))  # 12 tokens: too short to wait for
    for _ in range(3):
        llm.add_request(prompt, SamplingParams(max_tokens=4))
    llm.step()  # the prefill of all three; check_integrity runs after it
    reqs = list(llm.live.values())
    assert len(reqs) == 3 and llm.trace[-1].uids == [r.uid for r in reqs]
    whole = len(prompt) // page_size * page_size
    assert llm.cache.prefix_cache.size == whole
    rows = [llm.engine.page_table[r.table_idx, :whole].tolist() for r in reqs]
    assert rows[0] == rows[1] == rows[2]
    while not llm.is_idle:
        llm.step()
    llm.assert_all_free()
    assert all(llm.take_output(r.uid).token_ids == hf_refs.get(TINY_QWEN3, prompt, 4) for r in reqs)
