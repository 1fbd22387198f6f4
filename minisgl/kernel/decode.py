"""Decode attention for a few requests, and for many: one kernel that splits each request's keys and
merges the pieces itself.

At batch 1 a decode step's attention reads a few megabytes a layer, less than a microsecond at the
card's copy rate, yet a paged decode kernel plus a split-KV merge kernel is two launches, each bound
by latency rather than by reading. Here the grid is
(KV head, entry, split), an entry being a request's row and key count: every program reads one slice
of a request's keys for one KV head (and all the query heads that share it, GQA), and writes its
partial result (running max, sum of exponentials, weighted values) to a scratch buffer. The program
that finishes last for a (request, KV head), which it learns from an atomic counter, merges the
partials (`decode_merge.merge_splits`) and writes the output, so there is no second kernel. The
counter is back at zero when the kernel ends, ready for the next layer and for CUDA graph replays.

Keys are read through the page table (`page_table[row, position]` is a slot of the flat
`[slots, kv_heads, head_dim]` cache), so any page size works and no page list is built.

The Triton-decode attention backend (`minisgl.attention.triton_decode_backend`) gives it every
decode batch at head_dim 128 and below.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch

from .rope import PendingRope
from .util import next_pow2, use_triton



@dataclass(frozen=True)
class DecodeTile:
    """A program's inner loop: `block` keys a step, `stages` steps of software pipelining, `warps`
    warps sharing the work."""

    block: int
    stages: int
    warps: int = 4


SMALL_TILE = DecodeTile(block=64, stages=3, warps=2)  # a few requests: many splits, short programs
LARGE_TILE = DecodeTile(block=128, stages=2)  # many requests: one or two long splits each
DECODE_PROGRAMS_PER_SM = 2  # the small tile's split count aims at this many programs per SM
_MAX_SPLITS = 64
# programs start in grid order, first axis fastest: with the KV heads first, the programs reading one
# request's split for each KV head run side by side and read whole rows of the cache at once
HEADS_FIRST = True

try:
    import triton
    import triton.language as tl

    from . import decode_merge  # the last stage: the splits' partials merged into the output
    from .rope import norm_rope

    @triton.jit
    def _rotate_and_store(q_at, g_ok, b, h, d, k_ptr, v_ptr, k_stride, v_stride, kn_ptr, vn_ptr, kn_stride, vn_stride,
                          pos_ptr, loc_ptr, cos_ptr, sin_ptr, cos_stride, qw_ptr, kw_ptr, eps, store,
                          D: tl.constexpr, NORM: tl.constexpr):
        """Request b's query heads `q_at` normalised and rotated; with `store` (true for the split that holds the
        new key) also this step's key (normalised, rotated) and value written to their slot."""
        pos = tl.load(pos_ptr + b).to(tl.int64)
        c = tl.load(cos_ptr + pos * cos_stride + d[None, :]).to(k_ptr.dtype.element_ty)
        sn = tl.load(sin_ptr + pos * cos_stride + d[None, :]).to(k_ptr.dtype.element_ty)
        q = norm_rope(q_at, qw_ptr, d[None, :], g_ok[:, None], c, sn, eps, D // 2, NORM)
        if store:
            slot_new = tl.load(loc_ptr + b).to(tl.int64)
            k_new = norm_rope(kn_ptr + b * kn_stride + h * D, kw_ptr, d[None, :], d[None, :] < D, c, sn, eps, D // 2,
                              NORM)
            tl.store(k_ptr + slot_new * k_stride + h * D + d[None, :], k_new)
            tl.store(v_ptr + slot_new * v_stride + h * D + d, tl.load(vn_ptr + b * vn_stride + h * D + d))
            tl.debug_barrier()  # the whole program sees the new key before the loop reads it back
        return q

    @triton.jit
    def _attend_split(q, k_ptr, v_ptr, table_ptr, row, table_stride, k_stride, v_stride, h, d, start, end, sm_scale,
                      GP: tl.constexpr, D: tl.constexpr, BT: tl.constexpr):
        """Online softmax of q's heads over keys `start:end` of a request: (running max, sum, weighted values)."""
        m = tl.full([GP], float("-inf"), dtype=tl.float32)
        l = tl.zeros([GP], dtype=tl.float32)
        acc = tl.zeros([GP, D], dtype=tl.float32)
        for t0 in range(start, end, BT):
            t = t0 + tl.arange(0, BT)
            t_ok = t < end
            slot = tl.load(table_ptr + row * table_stride + t, mask=t_ok, other=0).to(tl.int64)
            k = tl.load(k_ptr + slot[:, None] * k_stride + h * D + d[None, :], mask=t_ok[:, None], other=0.0)
            v = tl.load(v_ptr + slot[:, None] * v_stride + h * D + d[None, :], mask=t_ok[:, None], other=0.0)
            scores = tl.dot(q, tl.trans(k)) * sm_scale  # [GP, BT], float32
            scores = tl.where(t_ok[None, :], scores, float("-inf"))
            m_new = tl.maximum(m, tl.max(scores, axis=1))
            p = tl.exp(scores - m_new[:, None])
            alpha = tl.exp(m - m_new)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
            l = l * alpha + tl.sum(p, axis=1)
            m = m_new
        return m, l, acc

    @triton.jit
    def _decode_kernel(q_ptr, k_ptr, v_ptr, table_ptr, rows_ptr, lens_ptr, order_ptr, part_ptr, ml_ptr, count_ptr,
                       out_ptr, q_stride, table_stride, k_stride, v_stride, sm_scale,
                       kn_ptr, vn_ptr, kn_stride, vn_stride, pos_ptr, loc_ptr, cos_ptr, sin_ptr, cos_stride, qw_ptr,
                       kw_ptr, eps, HKV: tl.constexpr, G: tl.constexpr, GP: tl.constexpr, GR: tl.constexpr,
                       D: tl.constexpr, SPLITS: tl.constexpr, BT: tl.constexpr, HEADS_FIRST: tl.constexpr,
                       ROPE: tl.constexpr, NORM: tl.constexpr, ORDERED: tl.constexpr):
        if HEADS_FIRST:  # grid (KV head, entry, split): a slot's heads are read by neighbouring programs
            h, e = tl.program_id(0), tl.program_id(1)
        else:  # grid (entry, KV head, split)
            e, h = tl.program_id(0), tl.program_id(1)
        s = tl.program_id(2)
        # entry e of rows and lens is request b's: its query, new key and output are at b; the scratch
        # and counter are the entry's (any one place per request does)
        b = tl.load(order_ptr + e) if ORDERED else e
        row = tl.load(rows_ptr + e).to(tl.int64)
        n = tl.load(lens_ptr + e)
        chunk = tl.cdiv(tl.cdiv(n, SPLITS), BT) * BT  # whole inner steps per split
        nsplit = tl.cdiv(n, chunk)  # at most SPLITS: a short request's last splits have no keys and do nothing
        if s >= nsplit:
            return
        g, d = tl.arange(0, GP), tl.arange(0, D)
        g_ok = g < G
        q_at = q_ptr + b * q_stride + (h * G + g[:, None]) * D  # query heads h*G .. h*G+G-1 of request b
        if ROPE:  # q and this step's k arrive unrotated; the split holding the new key stores it first
            q = _rotate_and_store(q_at, g_ok, b, h, d, k_ptr, v_ptr, k_stride, v_stride, kn_ptr, vn_ptr, kn_stride,
                                  vn_stride,
                                  pos_ptr, loc_ptr, cos_ptr, sin_ptr, cos_stride, qw_ptr, kw_ptr, eps, s == nsplit - 1,
                                  D, NORM)
        else:
            q = tl.load(q_at + d[None, :], mask=g_ok[:, None], other=0.0)
        start = s * chunk
        m, l, acc = _attend_split(q, k_ptr, v_ptr, table_ptr, row, table_stride, k_stride, v_stride, h, d, start,
                                  tl.minimum(start + chunk, n), sm_scale, GP, D, BT)
        if nsplit == 1:  # the only split: its result is the output (what the merge would compute, bit for bit)
            head_o = (b * HKV + h) * G + g
            tl.store(out_ptr + head_o[:, None] * D + d[None, :], (acc / l[:, None]).to(out_ptr.dtype.element_ty),
                     mask=g_ok[:, None])
            return
        # partials of the G real query rows: [B, HKV, SPLITS, GR, D] and [B, HKV, SPLITS, GR, 2]
        base = (e * HKV + h) * SPLITS
        tl.store(part_ptr + ((base + s) * GR + g[:, None]) * D + d[None, :], acc, mask=g_ok[:, None])
        tl.store(ml_ptr + ((base + s) * GR + g) * 2, m, mask=g_ok)
        tl.store(ml_ptr + ((base + s) * GR + g) * 2 + 1, l, mask=g_ok)
        tl.debug_barrier()  # every thread's partials are written before the counter moves
        done = tl.atomic_add(count_ptr + e * HKV + h, 1, sem="acq_rel")
        if done == nsplit - 1:  # the last program of this (request, KV head) merges
            decode_merge.merge_splits(part_ptr, ml_ptr, out_ptr, base, nsplit, b, h, d, HKV, G, GR, D, SPLITS)
            tl.atomic_xchg(count_ptr + e * HKV + h, 0)  # ready for the next launch

except ImportError:  # pragma: no cover
    triton = None


def decode_splits(batch_size: int, num_kv_heads: int, num_sms: int,
                  programs_per_sm: int = DECODE_PROGRAMS_PER_SM) -> int:
    """Splits per (request, KV head), a power of two: about `programs_per_sm` programs per SM."""
    want = max(1, (programs_per_sm * num_sms) // max(1, batch_size * num_kv_heads))
    return min(_MAX_SPLITS, 1 << (want.bit_length() - 1))


@dataclass
class DecodeScratch:
    """Partial results and counters for `decode_attention`, sized once for a batch-size limit."""

    part: torch.Tensor  # [pieces * kv_heads * next_pow2(group) * head_dim] float32
    ml: torch.Tensor  # [pieces * kv_heads * next_pow2(group) * 2] float32 (running max, sum)
    count: torch.Tensor  # [max_bs * kv_heads] int32, zero between launches

    @classmethod
    def for_batches(cls, max_bs: int, num_kv_heads: int, group: int, head_dim: int, num_sms: int, device: torch.device,
                    pieces: int = 0, rows: int = 0) -> DecodeScratch:
        """Room for any batch of up to `max_bs` requests at its `decode_splits`, and for `pieces`
        (request, split) pairs of up to `rows` requests (batches split by size)."""
        small = (bs * decode_splits(bs, num_kv_heads, num_sms) for bs in range(1, max_bs + 1))
        pieces = max(pieces, max(small, default=0))
        cells = pieces * num_kv_heads * next_pow2(group)
        return cls(
            torch.empty(cells * head_dim, dtype=torch.float32, device=device),
            torch.empty(cells * 2, dtype=torch.float32, device=device),
            torch.zeros(max(max_bs, rows) * num_kv_heads, dtype=torch.int32, device=device),
        )


def _group_pad(group: int) -> int:
    return max(16, next_pow2(group))  # tl.dot needs at least 16 rows


def decode_rope_fits(q: torch.Tensor, rope: PendingRope) -> bool:
    """Whether the kernel can rotate as it attends: unit-stride heads laid out as their views of the
    projection are, rotation tables in rows, qk-norm weights contiguous in the model dtype."""
    d = q.shape[-1]
    ok = all(t.dim() == 3 and t.stride(2) == 1 and t.stride(1) == d for t in (q, rope.k, rope.v))
    ok = ok and rope.cos.stride(-1) == 1 and rope.sin.stride() == rope.cos.stride() and rope.cos.shape[-1] == d
    norm = rope.qk_norm
    return ok and (norm is None or (norm[0].dtype == q.dtype and norm[0].is_contiguous() and norm[1].is_contiguous()))


def decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, page_table: torch.Tensor,
                     rows: torch.Tensor, kv_lens: torch.Tensor, scratch: DecodeScratch, splits: int,
                     tile: DecodeTile = SMALL_TILE, heads_first: bool = HEADS_FIRST,
                     rope: Optional[PendingRope] = None, order: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Decode attention in one launch: request i attends to the slots `page_table[rows[i], :kv_lens[i]]` of the
    caches (`[slots, kv_heads, d]`), as the torch backend's decode does; q `[bs, q_heads, d]`, and the
    result `[bs, q_heads, d]` in q's dtype. `rows` and `kv_lens` are int32 on the device (every
    `kv_lens[i] >= 1`), `scratch` was allocated for at least this batch size and `splits`. Each
    request's keys are cut into `splits` near-equal splits, each read `tile.block` keys at a time.

    `order` (int32 `[bs]` on the device, a permutation): entry i of `rows` and `kv_lens` belongs to
    request `order[i]` (its query row, output row and, with `rope`, its new key), and programs start in
    entry order. Listing the longest requests first lets the grid's last wave be its shortest programs;
    the result is the same bits in any order.

    `rope`: q (then possibly a strided view of the projection) and this step's k and v are not yet
    rotated or stored; the same launch applies the norms and RoPE and writes k and v to their slots,
    as `apply_rope_and_store` would before it (one kernel a layer fewer). It must pass `decode_rope_fits`."""
    assert use_triton(q) and (rope is None or decode_rope_fits(q, rope))
    if rope is None:
        q = q.contiguous()
    bs, hq, d = q.shape
    hkv = k_cache.shape[1]
    group = hq // hkv
    assert hq % hkv == 0 and q.stride(2) == 1 and q.stride(1) == d
    assert k_cache.stride(2) == 1 and k_cache.stride(1) == d and page_table.stride(1) == 1
    assert scratch.count.numel() >= bs * hkv and scratch.ml.numel() >= bs * hkv * splits * next_pow2(group) * 2
    out = torch.empty(bs, hq, d, dtype=q.dtype, device=q.device)
    grid = (hkv, bs, splits) if heads_first else (bs, hkv, splits)
    r = rope if rope is not None else PendingRope(rows, q, q, rows, q, q)  # placeholders, unread without ROPE
    qw, kw, eps = r.qk_norm if r.qk_norm is not None else (q, q, 0.0)
    _decode_kernel[grid](
        q, k_cache, v_cache, page_table, rows, kv_lens, order if order is not None else rows, scratch.part, scratch.ml,
        scratch.count, out,
        q.stride(0), page_table.stride(0), k_cache.stride(0), v_cache.stride(0), 1.0 / math.sqrt(d),
        r.k, r.v, r.k.stride(0), r.v.stride(0), r.positions, r.out_loc, r.cos, r.sin, r.cos.stride(0), qw, kw, eps,
        HKV=hkv, G=group, GP=_group_pad(group), GR=next_pow2(group), D=d, SPLITS=splits, BT=tile.block,
        HEADS_FIRST=heads_first,
        ROPE=rope is not None, NORM=r.qk_norm is not None, ORDERED=order is not None, num_warps=tile.warps,
        num_stages=tile.stages,
    )
    return out
