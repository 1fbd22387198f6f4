"""Chapter 5, attention backends: the torch backend over the paged pool equals naive attention,
and the base class's `forward` is the plain sequence (the layer's qk-norm and RoPE, then `attend`).

Oracle: per request, softmax(q k^T / sqrt(d)) v in float64 over the request's whole key sequence
(the cached prefix read back from the pool plus the new tokens), with a causal mask and grouped
KV heads repeated. Batches mix requests with and without cached prefixes, of different lengths,
scattered over shuffled pages, with every unused slot of the pool poisoned with NaN.
"""

from __future__ import annotations

from typing import List, Tuple

import pytest
import torch

from helpers import fill_batch, make_req, map_rows
from minisgl.attention import create_attention_backend
from minisgl.attention.base import BaseAttnBackend
from minisgl.attention.torch_backend import TorchAttnBackend
from minisgl.core import Batch
from minisgl.kvcache import MHAKVCache
from minisgl.layers.norm import RMSNorm
from minisgl.layers.rotary import QKNormRope, RotaryEmbedding

CPU = torch.device("cpu")
HQ, HKV, D = 4, 2, 16
NUM_PAGES = 64


def naive_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, first_pos: int) -> torch.Tensor:
    """q: [n, HQ, D] at positions first_pos.. ; k, v: [first_pos + n, HKV, D]. float64 reference."""
    q, k, v = q.double(), k.double(), v.double()
    rep = HQ // HKV
    k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q, k) / D**0.5
    qpos = first_pos + torch.arange(q.shape[0])[:, None]
    scores = scores.masked_fill(torch.arange(k.shape[0])[None, :] > qpos, float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), v)


def setup(page_size: int, specs: List[Tuple[int, int]], seed: int = 0):
    """A pool poisoned with NaN except the zeroed pad page, requests (cached_len, device_len) mapped to
    shuffled pages, their cached prefixes' KV already stored. Returns everything plus the full K/V."""
    gen = torch.Generator().manual_seed(seed)
    pool = MHAKVCache(1, NUM_PAGES + 1, page_size, HKV, D, torch.float32, CPU)
    pool.buffer.fill_(float("nan"))
    pool.buffer[:, :, NUM_PAGES * page_size :] = 0  # the pad page
    table = torch.zeros(len(specs) + 1, 64, dtype=torch.int32)
    reqs = []
    for i, (cached, total) in enumerate(specs):
        r = make_req(list(range(total)), row=i, cached_len=cached, uid=i)
        r.device_len = total
        reqs.append(r)
    map_rows(table, page_size, reqs, [t for _, t in specs], NUM_PAGES, seed=seed)
    full_k = [torch.randn(t, HKV, D, generator=gen) for _, t in specs]
    full_v = [torch.randn(t, HKV, D, generator=gen) for _, t in specs]
    for r, k, v in zip(reqs, full_k, full_v):
        slots = table[r.table_idx, : r.cached_len].long()
        pool.store_kv(k[: r.cached_len], v[: r.cached_len], slots, 0)
    backend = TorchAttnBackend(pool, table, pad_slot=NUM_PAGES * page_size)
    return pool, table, backend, reqs, full_k, full_v, gen


def run(phase: str, page_size: int, specs, seed: int = 0):
    pool, table, backend, reqs, full_k, full_v, gen = setup(page_size, specs, seed)
    batch = Batch(reqs=reqs, phase=phase)
    fill_batch(batch, table)
    backend.prepare_metadata(batch)
    new = lambda t: torch.cat([t[i][r.cached_len : r.device_len] for i, r in enumerate(reqs)])  # noqa: E731
    q = torch.randn(batch.num_tokens, HQ, D, generator=gen)
    out = backend.attend(q, new(full_k), new(full_v), layer_id=0, batch=batch)
    start = 0
    for i, r in enumerate(reqs):
        n = r.extend_len
        ref = naive_attention(q[start : start + n], full_k[i], full_v[i], r.cached_len)
        torch.testing.assert_close(out[start : start + n].double(), ref, rtol=1e-5, atol=1e-5)
        start += n
    return pool, table, reqs, full_k, full_v


@pytest.mark.parametrize("page_size", [1, 4])
def test_prefill_without_prefix_matches_naive_attention(page_size):
    run("prefill", page_size, [(0, 9), (0, 1), (0, 5)])


@pytest.mark.parametrize("page_size", [1, 4])
def test_prefill_after_a_cached_prefix_matches_naive_attention(page_size):
    """A prefix hit or a later chunk: queries start at cached_len and see the stored keys before them."""
    run("prefill", page_size, [(8, 13), (0, 6), (4, 5), (3, 10)], seed=1)


@pytest.mark.parametrize("page_size", [1, 4])
def test_decode_of_ragged_batch_matches_naive_attention(page_size):
    """One query per request; shorter requests are padded, and the padding must not leak in."""
    run("decode", page_size, [(12, 13), (1, 2), (6, 7), (0, 1)], seed=2)


def test_new_keys_and_values_land_in_the_pool_at_out_loc():
    pool, table, reqs, full_k, full_v = run("prefill", 4, [(3, 10), (0, 4)], seed=3)
    for i, r in enumerate(reqs):
        slots = table[r.table_idx, : r.device_len].long()
        torch.testing.assert_close(pool.k_cache(0)[slots], full_k[i])
        torch.testing.assert_close(pool.v_cache(0)[slots], full_v[i])


def test_metadata_describes_each_request():
    _, table, backend, reqs, *_ = setup(1, [(2, 5), (0, 3)])
    batch = Batch(reqs=reqs, phase="prefill")
    fill_batch(batch, table)
    backend.prepare_metadata(batch)
    meta = batch.attn_metadata
    assert meta.q_starts == [0, 3] and meta.cached_lens == [2, 0] and meta.kv_lens == [5, 3]
    assert meta.kv_mask.tolist() == [[True] * 5, [True] * 3 + [False] * 2]
    assert meta.kv_slots[0].tolist() == table[0, :5].tolist()
    assert meta.kv_slots[1, 3:].tolist() == [backend.pad_slot] * 2  # padding reads the pad slot


def test_registry_picks_torch_on_cpu_and_rejects_unknown_names():
    pool = MHAKVCache(1, 4, 1, HKV, D, torch.float32, CPU)
    table = torch.zeros(2, 4, dtype=torch.int32)
    assert isinstance(create_attention_backend("auto", pool, table), TorchAttnBackend)
    assert isinstance(create_attention_backend("torch", pool, table), TorchAttnBackend)
    with pytest.raises(ValueError, match="unknown attention backend 'magic'"):
        create_attention_backend("magic", pool, table)



def test_auto_with_no_runnable_backend_says_why_each_cannot_run(monkeypatch):
    from minisgl.attention import registry

    registry.backend_names()  # every backend registered
    refused = {n: registry.BackendEntry(e.make, e.priority, lambda *a, n=n: f"{n} refuses")
               for n, e in registry._BACKENDS.items()}
    monkeypatch.setattr(registry, "_BACKENDS", refused)
    with pytest.raises(ValueError, match=r"no attention backend runs on cpu.*\(.*torch: torch refuses"):
        registry.resolve_backend_name("auto", CPU, torch.float32, D)

# ---- the base class's forward is the plain sequence: qk (norms, RoPE), then attend ------------


class _AttendOnly(BaseAttnBackend):
    """A backend that writes only `prepare_metadata` and `attend` (both the torch backend's)."""

    def __init__(self, inner: TorchAttnBackend) -> None:
        self.inner = inner

    def prepare_metadata(self, batch: Batch) -> None:
        self.inner.prepare_metadata(batch)

    def attend(self, q, k, v, layer_id, batch):
        return self.inner.attend(q, k, v, layer_id, batch)


def _qk_step(qk_norm: bool) -> QKNormRope:
    rotary = RotaryEmbedding(D, 64, 10000.0, None, CPU)
    if not qk_norm:
        return QKNormRope(rotary)
    norms = [RMSNorm(D, 1e-6, dtype=torch.float32, device=CPU) for _ in range(2)]
    for n in norms:
        n.weight.copy_(torch.rand(D) + 0.5)
    return QKNormRope(rotary, *norms)


@pytest.mark.parametrize("qk_norm", [False, True], ids=["rope", "qk-norm-and-rope"])
@pytest.mark.parametrize("phase,specs", [("prefill", [(8, 13), (0, 6), (3, 10)]), ("decode", [(12, 13), (1, 2), (6, 7)])])
def test_base_forward_is_qk_then_attend(phase, specs, qk_norm):
    """Chapter 5: the layers call `forward` with q and k as the projection left them; the base class
    normalises and rotates them with the layer's `qk`, then calls `attend`, so a backend that writes
    only `attend` computes attention over rotated queries and keys and stores the rotated keys."""
    pool, table, inner, reqs, full_k, full_v, gen = setup(1, specs, seed=4)
    qk = _qk_step(qk_norm)
    positions = [torch.arange(t) for _, t in specs]
    rotated_k = [qk(p, torch.zeros(len(p), HQ, D), k)[1] for p, k in zip(positions, full_k)]
    for r, k, v in zip(reqs, rotated_k, full_v):  # an earlier step stored its prefix already rotated
        slots = table[r.table_idx, : r.cached_len].long()
        pool.store_kv(k[: r.cached_len], v[: r.cached_len], slots, 0)
    batch = Batch(reqs=reqs, phase=phase)
    fill_batch(batch, table)
    backend = _AttendOnly(inner)
    backend.prepare_metadata(batch)
    new = lambda t: torch.cat([t[i][r.cached_len : r.device_len] for i, r in enumerate(reqs)])  # noqa: E731
    q = torch.randn(batch.num_tokens, HQ, D, generator=gen)
    out = backend.forward(q, new(full_k), new(full_v), 0, batch, qk)

    q_rot, _ = qk(batch.positions, q, new(full_k))
    start = 0
    for i, r in enumerate(reqs):
        n = r.extend_len
        ref = naive_attention(q_rot[start : start + n], rotated_k[i], full_v[i], r.cached_len)
        torch.testing.assert_close(out[start : start + n].double(), ref, rtol=1e-5, atol=1e-5)
        slots = table[r.table_idx, : r.device_len].long()
        torch.testing.assert_close(pool.k_cache(0)[slots], rotated_k[i])  # the pool holds rotated keys
        start += n
    # and the same numbers as rotating first and calling the torch backend's attend directly
    q2, k2 = qk(batch.positions, q, new(full_k))
    assert torch.equal(out, inner.attend(q2, k2, new(full_v), 0, batch))


def test_a_backend_must_write_attend_and_prepare_metadata():
    class _NoAttend(BaseAttnBackend):
        def prepare_metadata(self, batch):
            pass

    with pytest.raises(TypeError, match="attend"):
        _NoAttend()
