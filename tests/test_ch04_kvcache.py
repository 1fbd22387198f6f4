"""Chapter 4, the KV pool and the page table.

Claims: the pool is one tensor `[2, layers, pages * page_size, kv_heads, head_dim]` addressed by
slot; `store_kv` writes exactly the slots it is given; table rows are handed out and taken back
exactly once; `TableManager.map_pages` gives a batch's new positions slots in whole pages, as
a position-by-position reference does; the engine sizes its page table `[max_running_reqs + 1, max_seq_len]` with a last
dummy row pointing at a dummy page, and refuses configurations that cannot hold one context.
"""

from __future__ import annotations

import random

import pytest
import torch

from helpers import TINY_QWEN3, build_engine
from minisgl.engine import EngineConfig
from minisgl.core import BaseCacheHandle, Req, SamplingParams
from minisgl.kvcache import MHAKVCache
from minisgl.scheduler.table import TableManager

CPU = torch.device("cpu")


def test_pool_layout_and_views():
    pool = MHAKVCache(num_layers=3, num_pages=5, page_size=4, num_kv_heads=2, head_dim=8, dtype=torch.float32, device=CPU)
    assert pool.buffer.shape == (2, 3, 20, 2, 8) and pool.num_slots == 20
    assert pool.k_cache(1).data_ptr() == pool.buffer[0, 1].data_ptr()  # views, not copies
    assert pool.v_cache(2).data_ptr() == pool.buffer[1, 2].data_ptr()


def test_bytes_per_page_is_the_pool_size_per_page():
    pool = MHAKVCache(4, 6, 2, 3, 16, torch.bfloat16, CPU)
    per_page = MHAKVCache.bytes_per_page(4, 2, 3, 16, torch.bfloat16)
    assert per_page * 6 == pool.buffer.numel() * pool.buffer.element_size()


def test_store_kv_writes_only_the_given_slots_of_the_given_layer():
    pool = MHAKVCache(2, 8, 1, 2, 4, torch.float32, CPU)
    pool.buffer.zero_()
    k, v = torch.randn(3, 2, 4), torch.randn(3, 2, 4)
    loc = torch.tensor([6, 1, 4])
    pool.store_kv(k, v, loc, layer=1)
    assert torch.equal(pool.k_cache(1)[loc], k) and torch.equal(pool.v_cache(1)[loc], v)
    untouched = torch.ones(8, dtype=torch.bool)
    untouched[loc] = False
    assert pool.k_cache(1)[untouched].abs().sum() == 0 and pool.v_cache(1)[untouched].abs().sum() == 0
    assert pool.buffer[:, 0].abs().sum() == 0  # the other layer is untouched


# ---- the page-table write ----------------------------------------------------------------------
def _naive_map(table: torch.Tensor, spans, page_size: int, free: list) -> list:
    """Position by position: a position that starts a page takes the next free page."""
    asked = 0
    for row, cached, device in spans:
        for pos in range(cached, device):
            if pos % page_size == 0:
                page, asked = free.pop(0), asked + 1
                for k in range(page_size):
                    if pos + k < table.shape[1]:
                        table[row, pos + k] = page * page_size + k
    return asked


@pytest.mark.parametrize("seed", range(6))
def test_map_pages_matches_a_position_by_position_reference(seed):
    rng = random.Random(seed)
    ps, width, rows = rng.choice([1, 2, 4, 8]), rng.choice([16, 21, 32]), rng.randint(1, 5)
    fast, slow = torch.full((rows + 1, width), -1, dtype=torch.int32), torch.full((rows + 1, width), -1, dtype=torch.int32)
    free = list(range(200))
    reqs = []
    for row in range(rows):
        r = Req(torch.arange(rng.randint(1, width - 2), dtype=torch.int32), row, 0, row, SamplingParams(max_tokens=width), BaseCacheHandle(0))
        r.device_len = rng.randint(1, r.prompt_len)
        reqs.append(r)
    for _ in range(12):  # each step computes 1 to 4 more positions of each request (prefill chunks, decode)
        live = [r for r in reqs if r.device_len <= width]
        spans = [(r.table_idx, r.cached_len, r.device_len) for r in live]
        calls = []

        def take(n):
            calls.append(n)
            pages, free[:] = free[:n], free[n:]
            return torch.tensor(pages, dtype=torch.int64)

        expected_pages = free.copy()
        TableManager.map_pages(fast, live, ps, take)
        asked = _naive_map(slow, spans, ps, expected_pages)
        assert calls == ([asked] if asked else [])  # one call for the batch, with the total
        assert torch.equal(fast, slow)
        assert [(r.table_idx, r.cached_len, r.device_len) for r in live] == spans  # requests untouched
        for r in live:
            r.cached_len, r.device_len = r.device_len, r.device_len + rng.randint(1, 4)


# ---- table rows ------------------------------------------------------------------------------


def test_table_hands_out_every_row_once_and_takes_it_back():
    table = TableManager(4, torch.zeros(5, 16, dtype=torch.int32))
    rows = [table.allocate() for _ in range(4)]
    assert sorted(rows) == [0, 1, 2, 3] and table.available_size == 0
    assert table.token_pool.shape == table.page_table.shape
    table.free(rows[2])
    assert table.available_size == 1 and table.allocate() == rows[2]
    for r in rows:
        table.free(r)
    table.check_integrity([])


def test_table_rejects_double_free_and_the_dummy_row():
    table = TableManager(2, torch.zeros(3, 4, dtype=torch.int32))
    row = table.allocate()
    table.free(row)
    with pytest.raises(AssertionError, match="freed twice"):
        table.free(row)
    with pytest.raises(AssertionError):
        table.free(2)  # the dummy row is never handed out


def test_table_integrity_catches_a_leaked_row():
    table = TableManager(3, torch.zeros(4, 4, dtype=torch.int32))
    a, b = table.allocate(), table.allocate()
    table.check_integrity([a, b])
    with pytest.raises(AssertionError, match="leaked"):
        table.check_integrity([a])  # b is neither free nor owned by a live request


# ---- the engine's pool and page table ----------------------------------------------------------


def test_engine_page_table_shape_and_dummy_row():
    engine = build_engine(TINY_QWEN3, page_size=4, max_running_reqs=3, num_pages=10, max_seq_len=64)
    assert engine.page_table.shape == (3 + 1, 64) and engine.page_table.dtype == torch.int32
    dummy_slot = engine.dummy_page * engine.page_size
    assert engine.dummy_page == 10 and bool((engine.page_table[3] == dummy_slot).all())
    assert engine.kv_cache.num_pages == 10 + 1  # one extra page takes padding writes
    cfg = engine.model_config
    assert engine.kv_cache.buffer.shape == (2, cfg.num_layers, 11 * 4, cfg.num_kv_heads, cfg.head_dim)


def test_max_seq_len_is_clipped_to_the_model_context():
    engine = build_engine(TINY_QWEN3, max_seq_len=10**6, num_pages=64)
    assert engine.max_seq_len == engine.model_config.max_position_embeddings


def test_pool_sized_from_the_cpu_budget():
    engine = build_engine(TINY_QWEN3, num_pages=None, max_seq_len=256, max_running_reqs=2, cpu_kv_budget_gb=0.001)
    per_page = MHAKVCache.bytes_per_page(2, 1, 2, 32, torch.float32)
    assert engine.num_pages == min(int(0.001 * 2**30) // per_page, 2 * 256)


def test_budget_below_one_context_is_refused():
    with pytest.raises(MemoryError, match="less than one full context"):
        # the CPU budget is a setting; on a GPU the pool is sized from free memory instead
        build_engine(TINY_QWEN3, device="cpu", num_pages=None, max_seq_len=2048, cpu_kv_budget_gb=1e-5)


@pytest.mark.parametrize("page_size", [0, 3, 6, -4])
def test_bad_page_size_is_rejected_by_name(page_size):
    with pytest.raises(ValueError, match=f"page_size must be a power of two, got {page_size}"):
        EngineConfig(model_path=str(TINY_QWEN3), page_size=page_size)


def test_missing_model_directory_says_what_to_do(tmp_path):
    with pytest.raises(FileNotFoundError, match="prepare_models"):
        EngineConfig(model_path=str(tmp_path / "nowhere"))
