"""Chapter 1, core: the request ledger, sampling parameters, the batch and the forward context.

Claims: a request is three lengths with ``0 <= cached_len < device_len <= max_device_len``;
`complete_one` moves them on by exactly one step (a whole prompt, a chunk, or one decode token);
user-fixable mistakes in sampling parameters raise `InvalidRequestError` naming the bad value.
"""

from __future__ import annotations

import pytest
import torch

from minisgl.core import (
    Batch,
    Context,
    InvalidRequestError,
    Req,
    SamplingParams,
    get_global_ctx,
    set_global_ctx,
)
from minisgl.kvcache.base import BaseCacheHandle


def make_req(prompt_len: int = 5, max_tokens: int = 3, cached_len: int = 0, uid: int = 0) -> Req:
    ids = torch.arange(100, 100 + prompt_len, dtype=torch.int32)
    return Req(ids, table_idx=0, cached_len=cached_len, uid=uid, sampling_params=SamplingParams(max_tokens=max_tokens),
               cache_handle=BaseCacheHandle(cached_len))


# ---- SamplingParams -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, words",
    [
        (dict(max_tokens=0), "max_tokens"),
        (dict(max_tokens=-3), "max_tokens"),
        (dict(max_tokens=2.5), "max_tokens"),
        (dict(temperature=-0.1), "temperature"),
        (dict(top_k=0), "top_k"),
        (dict(top_k=-2), "top_k"),
        (dict(top_p=0.0), "top_p"),
        (dict(top_p=1.5), "top_p"),
    ],
)
def test_bad_sampling_params_raise_invalid_request_naming_the_field(kwargs, words):
    with pytest.raises(InvalidRequestError, match=words):
        SamplingParams(**kwargs)


def test_invalid_request_error_is_a_value_error():
    """Callers that catch ValueError keep working."""
    assert issubclass(InvalidRequestError, ValueError)


def test_greedy_means_temperature_zero_or_top_k_one():
    assert SamplingParams().is_greedy
    assert SamplingParams(temperature=0.7, top_k=1).is_greedy
    assert not SamplingParams(temperature=0.7).is_greedy
    assert not SamplingParams(temperature=0.7, top_p=0.01).is_greedy  # still sampled, just from few tokens


def test_sampling_params_are_frozen():
    with pytest.raises(Exception):
        SamplingParams().max_tokens = 3  # type: ignore[misc]


# ---- Req: the three lengths ---------------------------------------------------------------------


def test_new_request_ledger():
    r = make_req(prompt_len=5, max_tokens=3)
    assert (r.cached_len, r.device_len, r.max_device_len) == (0, 5, 8)
    assert r.prompt_len == 5 and r.extend_len == 5 and r.remain_len == 3
    assert not r.is_chunk and r.can_decode
    assert r.output_ids.numel() == 0


def test_ledger_walks_through_prefill_and_decode():
    """Prefill computes the prompt; each decode step adds one token until max_device_len."""
    r = make_req(prompt_len=5, max_tokens=3)
    r.complete_one()  # prefill launched: the prompt's KV is (about to be) stored
    assert (r.cached_len, r.device_len) == (5, 6) and r.extend_len == 1
    r.append_host(7)
    r.complete_one()
    assert (r.cached_len, r.device_len) == (6, 7)
    r.append_host(8)
    r.complete_one()
    assert (r.cached_len, r.device_len) == (7, 8)
    assert r.remain_len == 0 and not r.can_decode
    r.append_host(9)
    assert r.output_ids.tolist() == [7, 8, 9]
    assert r.input_ids.dtype == torch.int32


def test_chunked_prefill_samples_nothing_until_the_prompt_is_done():
    r = make_req(prompt_len=10, max_tokens=2)
    r.device_len = 4  # the scheduler gives this step a 4-token budget
    assert r.is_chunk and not r.can_decode and r.extend_len == 4
    r.complete_one()
    # the rest of the prompt is now pending; the scheduler will cut it again if needed
    assert (r.cached_len, r.device_len) == (4, 10) and not r.is_chunk
    r.complete_one()
    assert (r.cached_len, r.device_len) == (10, 11) and r.can_decode


def test_prefix_hit_starts_with_cached_tokens():
    r = make_req(prompt_len=8, max_tokens=2, cached_len=4)
    assert r.extend_len == 4 and r.cached_len == 4


@pytest.mark.parametrize("cached_len", [5, 6, -1])
def test_broken_ledger_is_caught_at_creation(cached_len):
    """cached_len must stay below device_len: at least one prompt token is always computed."""
    with pytest.raises(AssertionError, match="ledger"):
        make_req(prompt_len=5, cached_len=cached_len)


def test_broken_ledger_is_caught_by_check():
    r = make_req(prompt_len=5, max_tokens=2)
    r.device_len = 9  # past max_device_len = 7
    with pytest.raises(AssertionError, match="ledger"):
        r.check()


def test_decode_past_max_device_len_is_refused():
    r = make_req(prompt_len=2, max_tokens=1)
    r.complete_one()
    assert r.device_len == r.max_device_len
    with pytest.raises(AssertionError):
        r.complete_one()


# ---- Batch ------------------------------------------------------------------------------------


def test_batch_counts_tokens_of_its_requests():
    a, b = make_req(prompt_len=5, uid=0), make_req(prompt_len=3, uid=1, cached_len=1)
    batch = Batch(reqs=[a, b], phase="prefill")
    assert batch.size == 2 and batch.num_tokens == 5 + 2
    assert batch.is_prefill and not batch.is_decode
    assert batch.input_ids is None and batch.attn_metadata is None  # filled later by prepare()


# ---- the global forward context ---------------------------------------------------------------


@pytest.fixture
def restore_ctx():
    import minisgl.core as core

    saved = core._GLOBAL_CTX
    yield
    set_global_ctx(saved)


def test_no_context_before_an_engine(restore_ctx):
    set_global_ctx(None)
    with pytest.raises(AssertionError, match="no engine"):
        get_global_ctx()


def test_forward_batch_sets_and_clears_the_batch_even_on_error(restore_ctx):
    ctx = Context(page_size=1)
    set_global_ctx(ctx)
    batch = Batch(reqs=[make_req()], phase="prefill")
    with ctx.forward_batch(batch):
        assert get_global_ctx().batch is batch
    assert ctx.batch is None
    with pytest.raises(RuntimeError):
        with ctx.forward_batch(batch):
            raise RuntimeError("boom")
    assert ctx.batch is None


def test_forward_passes_do_not_nest(restore_ctx):
    ctx = Context(page_size=1)
    batch = Batch(reqs=[make_req()], phase="prefill")
    with ctx.forward_batch(batch):
        with pytest.raises(AssertionError, match="nest"):
            with ctx.forward_batch(batch):
                pass
