"""Chapter 8, the cache manager: the one owner of KV pages.

Claims: a request gets whole pages for positions [cached_len, device_len) and its page-table row
points into them; every page is always in exactly one place (free list, prefix cache, or a live
request) and the integrity check catches a page that is lost or shared; admission reserves the
pages a request needs to finish, so a tight pool makes requests wait instead of failing; the naive
prefix cache never reuses anything. Chapter 7's scheduler, with the page allocator alone (no
prefix cache), serves requests and gives every page back; the scheduler composed with the
prefix-cache mixin reuses a prompt it served before.
"""

from __future__ import annotations

import pytest
import torch

from helpers import MAX_TOKENS, TINY_QWEN3, build_llm, generate_ids, make_req, prompt_ids, small_engine_kwargs
from minisgl.core import SamplingParams
from minisgl.kvcache import NaivePrefixCache, RadixPrefixCache
from minisgl.scheduler.cache import CacheManager
from minisgl.scheduler.pages import PageAllocator

CPU = torch.device("cpu")


def manager(num_pages=8, page_size=4, rows=3, width=32, cache="naive") -> CacheManager:
    prefix = NaivePrefixCache(1, CPU) if cache == "naive" else RadixPrefixCache(page_size, CPU)
    return CacheManager(num_pages, page_size, prefix, torch.full((rows + 1, width), -1, dtype=torch.int32))


def test_allocate_maps_positions_to_whole_pages():
    cm = manager(page_size=4)
    r = make_req(list(range(10)), row=1)
    cm.allocate([r])
    slots = cm.page_table[1, :12]
    pages = slots // 4
    assert cm.free_pages == 8 - 3
    for p in range(3):  # each group of 4 positions lies in one page, in order
        assert len(set(pages[4 * p : 4 * p + 4].tolist())) == 1
        assert (slots[4 * p : 4 * p + 4] % 4).tolist() == [0, 1, 2, 3]
    assert len(set(pages.tolist())) == 3


def test_allocation_continues_in_the_partly_filled_page():
    """After a prefill of 6 tokens (2 pages), decoding positions 6 and 7 needs no new page; 8 does."""
    cm = manager(page_size=4)
    r = make_req(list(range(6)), row=0, max_tokens=8)
    cm.allocate([r])
    r.complete_one()  # cached 6, device 7
    assert cm.free_pages == 6 and CacheManager.owned_pages(r, 4) == 2
    cm.allocate([r])
    assert cm.free_pages == 6
    r.complete_one()
    r.complete_one()  # cached 8: the next position opens page 3
    cm.allocate([r])
    assert cm.free_pages == 5
    assert cm.pages_to_finish(r) == -(-(r.max_device_len - 1) // 4) - 2


def test_release_returns_every_page_with_the_naive_cache():
    cm = manager(page_size=4)
    reqs = [make_req(list(range(n)), row=i, uid=i) for i, n in enumerate([5, 9, 1])]
    cm.allocate(reqs)
    for r in reqs:
        r.complete_one()
    cm.check_integrity(reqs)
    for r in reqs:
        cm.release(r)
    assert cm.free_pages == 8
    cm.check_integrity([])


@pytest.mark.gpu
def test_pages_freed_on_the_gpu_count_at_once_and_come_back_without_a_wait():
    """On the GPU, freed slots are read back behind the stream's work rather than at once (which would
    stall the host until every launched step ends): the pages count as free immediately, and an
    allocation that needs them waits for their copy."""
    dev = torch.device("cuda")
    cm = CacheManager(8, 4, NaivePrefixCache(1, dev), torch.full((4, 32), -1, dtype=torch.int32, device=dev))
    reqs = [make_req(list(range(n)), row=i, uid=i) for i, n in enumerate([5, 9])]
    cm.allocate(reqs)
    for r in reqs:
        r.complete_one()
    torch.cuda._sleep(50_000_000)  # keep the stream busy, so the copies below are still queued
    for r in reqs:
        cm.release(r)
    assert cm.free_pages == 8
    whole = make_req(list(range(32)), row=2, uid=2)  # all 8 pages: the 5 just freed among them
    cm.allocate([whole])
    assert cm.free_pages == 0
    assert sorted((cm.page_table[2, ::4] // 4).tolist()) == list(range(8))
    whole.complete_one()
    cm.check_integrity([whole])


def test_integrity_check_catches_a_lost_page():
    cm = manager()
    r = make_req(list(range(5)), row=0)
    cm.allocate([r])
    r.complete_one()
    with pytest.raises(AssertionError, match="leaked or shared"):
        cm.check_integrity([])  # r's pages are neither free nor accounted to a live request


def test_integrity_check_catches_a_shared_page():
    cm = manager()
    a, b = make_req(list(range(4)), row=0, uid=0), make_req(list(range(4)), row=1, uid=1)
    cm.allocate([a, b])
    cm.page_table[1, :4] = cm.page_table[0, :4]  # b now points at a's page: one page is lost
    for r in (a, b):
        r.complete_one()
    with pytest.raises(AssertionError, match="leaked or shared"):
        cm.check_integrity([a, b])


def test_running_out_of_pages_is_an_error_not_a_silent_overwrite():
    cm = manager(num_pages=2, page_size=4)
    with pytest.raises(MemoryError, match="out of KV pages"):
        cm.allocate([make_req(list(range(12)), row=0)])


def test_the_page_allocator_alone_frees_every_page_a_request_had():
    pa = PageAllocator(8, 4, torch.full((4, 32), -1, dtype=torch.int32))
    reqs = [make_req(list(range(n)), row=i, uid=i) for i, n in enumerate([5, 9, 1])]
    pa.allocate(reqs)
    for r in reqs:
        r.complete_one()
    assert pa.free_pages == pa.available_pages == 8 - 2 - 3 - 1 and len(pa.kept_pages()) == 0
    pa.check_integrity(reqs)
    pa.release(reqs[1])
    assert pa.free_pages == 5
    pa.check_integrity([reqs[0], reqs[2]])
    with pytest.raises(MemoryError, match="out of KV pages"):  # nothing to reclaim: no cache
        pa.allocate([make_req(list(range(24)), row=1, uid=3)])


def test_the_cache_manager_counts_evictable_pages_and_evicts_when_the_free_list_is_short():
    cm = manager(num_pages=4, page_size=4, cache="radix")
    a = make_req(list(range(12)), row=0, max_tokens=1)
    a.cache_handle = cm.match(a.input_ids).handle  # the radix cache's own (empty) handle
    cm.allocate([a])
    a.complete_one()
    cm.release(a)  # 3 whole pages go to the cache, unlocked
    assert (cm.free_pages, cm.available_pages, len(cm.kept_pages())) == (1, 4, 3)
    cm.check_integrity([])
    b = make_req(list(range(100, 112)), row=1, max_tokens=1)
    b.cache_handle = cm.match(b.input_ids).handle
    cm.allocate([b])  # 3 pages with 1 free: the cache gives back at least 2 (the radix cache its whole entry)
    b.complete_one()
    assert cm.free_pages + len(cm.kept_pages()) == 1 and cm.prefix_cache.size < 12
    cm.check_integrity([b])


# ---- through the scheduler ---------------------------------------------------------------------


def test_chapter_7s_scheduler_serves_with_the_page_allocator_and_frees_every_page(hf_refs):
    from minisgl.engine import EngineConfig
    from minisgl.scheduler import Scheduler, SchedulerConfig

    engine = EngineConfig(model_path=str(TINY_QWEN3), **small_engine_kwargs(page_size=4))
    sched = Scheduler(SchedulerConfig(engine=engine, overlap=False, check_integrity=True))  # no mixin
    assert type(sched.cache) is PageAllocator
    tokens = {}
    sched.on_token = lambda req, token, reason: token is not None and tokens.setdefault(req.uid, []).append(token)
    prompts = prompt_ids(TINY_QWEN3)
    for _ in range(2):  # the second round computes every prompt again: nothing is kept
        uids = [sched.add_request(p, SamplingParams(max_tokens=n)) for p, n in zip(prompts, MAX_TOKENS)]
        while not sched.is_idle:
            sched.step()
        sched.assert_all_free()
        assert sched.cache.free_pages == sched.cache.num_pages
        assert [tokens[u] for u in uids] == [hf_refs.get(TINY_QWEN3, p, n) for p, n in zip(prompts, MAX_TOKENS)]
    assert all(c == 0 for t in sched.trace for c in t.cached_lens if t.phase == "prefill")


def test_the_composed_scheduler_reuses_a_prompt_it_served(hf_refs):
    from minisgl.scheduler import PrefixCacheMixin

    llm = build_llm(TINY_QWEN3, prefix_cache="radix", page_size=4)
    assert PrefixCacheMixin in type(llm).__mro__ and isinstance(llm.cache, CacheManager)
    prompt = prompt_ids(TINY_QWEN3)[4]
    first, second = (llm.generate([prompt], SamplingParams(max_tokens=4))[0] for _ in range(2))
    assert first.cached_tokens == 0 and second.cached_tokens == (len(prompt) - 1) // 4 * 4 > 0
    assert first.token_ids == second.token_ids == hf_refs.get(TINY_QWEN3, prompt, 4)
    llm.assert_all_free()



@pytest.mark.parametrize("page_size", [1, 4])
def test_tight_pool_makes_requests_wait_not_fail(page_size, hf_refs):
    """A pool holding about two requests at a time: admission reserves pages to the end."""
    prompts = [list(range(200 + 7 * i, 230 + 7 * i)) for i in range(5)]  # 30 tokens each
    llm = build_llm(TINY_QWEN3, page_size=page_size, num_pages=80 // page_size, max_running_reqs=4, prefix_cache="naive")
    got = generate_ids(llm, prompts, 10)
    assert got == [hf_refs.get(TINY_QWEN3, p, 10) for p in prompts]
    assert max(len(t.uids) for t in llm.trace) == 2  # the pool, not the 4 rows, limited the batch


def test_naive_cache_never_reuses(hf_refs):
    llm = build_llm(TINY_QWEN3, prefix_cache="naive", page_size=4)
    prompts = prompt_ids(TINY_QWEN3)
    for _ in range(2):
        outs = llm.generate(prompts, [SamplingParams(max_tokens=n) for n in MAX_TOKENS])
        llm.assert_all_free()
        assert all(o.cached_tokens == 0 for o in outs)
        assert [o.token_ids for o in outs] == [hf_refs.get(TINY_QWEN3, p, n) for p, n in zip(prompts, MAX_TOKENS)]
    assert llm.cache.prefix_cache.size == 0 and llm.cache.free_pages == llm.cache.num_pages
    assert sum(t.cached_lens[i] for t in llm.trace for i in range(len(t.uids)) if t.phase == "prefill") == 0


def test_radix_cache_keeps_pages_but_all_are_accounted(hf_refs):
    llm = build_llm(TINY_QWEN3, prefix_cache="radix", page_size=4)
    prompts = prompt_ids(TINY_QWEN3)
    assert generate_ids(llm, prompts, MAX_TOKENS) == [hf_refs.get(TINY_QWEN3, p, n) for p, n in zip(prompts, MAX_TOKENS)]
    cache = llm.cache
    assert cache.prefix_cache.size > 0 and cache.prefix_cache.protected_size == 0
    assert cache.free_pages + cache.prefix_cache.size // 4 == cache.num_pages


@pytest.mark.parametrize("page_size", [1, 4])
def test_a_request_filling_the_context_exactly_runs(page_size, hf_refs):
    """prompt + max_tokens == max_seq_len is allowed; with 62 columns and 4-token pages the last
    page sticks out of the page table, and the manager must not write past it."""
    llm = build_llm(TINY_QWEN3, page_size=page_size, max_seq_len=62, num_pages=64 // page_size)
    prompt = list(range(500, 558))
    out = llm.generate([prompt], SamplingParams(max_tokens=4))[0]
    llm.assert_all_free()
    assert out.token_ids == hf_refs.get(TINY_QWEN3, prompt, 4)
