"""Decode attention as one stream of key tiles shared out evenly over the SMs, against the engine's Triton
decode kernel (a grid of (KV head, request, split) programs, one resident per SM at the large tile).

Every (request, KV head) pair is an item; its keys are tiles of 128. The items' tiles, laid end to end, are cut
into one equal run per program, so each program starts its pipeline once and reads about the same number of
keys, crossing from item to item inside one loop. A program writes an item it holds whole straight to the
output; an item cut between programs leaves a partial from each (running max, sum, weighted values), and the
last program to finish it (an atomic counter) merges them after its loop. Microseconds a layer at the offline
workload's lengths in the engine's slot layout, in a CUDA graph; each output checked against the engine's.
`python -P tools/gpu_probes/decode_stream.py` (tools/gpu_probes and the tree on the path)"""
import math
import random
import sys
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np
import torch
import triton
import triton.language as tl

from minisgl.kernel.util import next_pow2

STREAM_BLOCK = 128  # keys per tile, the large-batch tile's
STREAM_STAGES = 2


@triton.jit
def _stream_kernel(q_ptr, k_ptr, v_ptr, table_ptr, plan_ptr, part_ptr, ml_ptr, count_ptr, out_ptr,
                   q_stride, table_stride, k_stride, v_stride, sm_scale, PIECES_AT, INFO_AT,
                   HKV: tl.constexpr, G: tl.constexpr, GP: tl.constexpr, GR: tl.constexpr, D: tl.constexpr, BT: tl.constexpr,
                   BRANCHLESS: tl.constexpr):
    p = tl.program_id(0)
    j0 = tl.load(plan_ptr + p)
    j1 = tl.load(plan_ptr + p + 1)
    pieces_ptr = plan_ptr + PIECES_AT  # per item: its first program, how many programs hold a piece
    info_ptr = plan_ptr + INFO_AT  # per tile: item, row, first key, key count
    g = tl.arange(0, GP)
    d = tl.arange(0, D)
    g_ok = g < G
    m = tl.full([GP], float("-inf"), dtype=tl.float32)
    l = tl.zeros([GP], dtype=tl.float32)
    acc = tl.zeros([GP, D], dtype=tl.float32)
    merge_a = -1  # the (at most two) items this program was last to finish: merged after the loop
    merge_b = -1
    for j in range(j0, j1):
        item = tl.load(info_ptr + j * 4)
        row = tl.load(info_ptr + j * 4 + 1).to(tl.int64)
        t0 = tl.load(info_ptr + j * 4 + 2)
        n = tl.load(info_ptr + j * 4 + 3)
        b = item // HKV
        h = item % HKV
        q = tl.load(q_ptr + b * q_stride + (h * G + g[:, None]) * D + d[None, :], mask=g_ok[:, None], other=0.0)
        t = t0 + tl.arange(0, BT)
        t_ok = t < n
        slot = tl.load(table_ptr + row * table_stride + t, mask=t_ok, other=0).to(tl.int64)
        k = tl.load(k_ptr + slot[:, None] * k_stride + h * D + d[None, :], mask=t_ok[:, None], other=0.0)
        v = tl.load(v_ptr + slot[:, None] * v_stride + h * D + d[None, :], mask=t_ok[:, None], other=0.0)
        fresh = (j == j0) | (t0 == 0)  # this program's first tile of the item: start its sums afresh
        m = tl.where(fresh, float("-inf"), m)
        l = tl.where(fresh, 0.0, l)
        acc = tl.where(fresh, 0.0, acc)
        scores = tl.dot(q, tl.trans(k)) * sm_scale  # [GP, BT], float32
        scores = tl.where(t_ok[None, :], scores, float("-inf"))
        m_new = tl.maximum(m, tl.max(scores, axis=1))
        pr = tl.exp(scores - m_new[:, None])
        alpha = tl.exp(m - m_new)
        acc = acc * alpha[:, None] + tl.dot(pr.to(v.dtype), v)
        l = l * alpha + tl.sum(pr, axis=1)
        m = m_new
        if BRANCHLESS:  # every store masked, no branch in the loop
            last = (t0 + BT >= n) | (j == j1 - 1)
            npieces = tl.load(pieces_ptr + item * 2 + 1)
            direct = (g_ok & last & (npieces == 1)) != 0  # [GP] (!= 0: the interpreter's & of these gives int32)
            cut = (last & (npieces > 1)) != 0
            cut_g = (g_ok & cut) != 0
            head_o = item * G + g
            tl.store(out_ptr + head_o[:, None] * D + d[None, :], (acc / l[:, None]).to(out_ptr.dtype.element_ty), mask=direct[:, None])
            seg = item + p
            tl.store(part_ptr + (seg * GR + g[:, None]) * D + d[None, :], acc, mask=cut_g[:, None])
            tl.store(ml_ptr + (seg * GR + g) * 2, m, mask=cut_g)
            tl.store(ml_ptr + (seg * GR + g) * 2 + 1, l, mask=cut_g)
            tl.debug_barrier()
            done = tl.atomic_add(count_ptr + item, 1, mask=cut, sem="acq_rel")
            mine = (cut & (done == npieces - 1)) != 0
            merge_b = tl.where(mine & (merge_a >= 0), item, merge_b)
            merge_a = tl.where(mine & (merge_a < 0), item, merge_a)
        elif (j == j1 - 1) | (t0 + BT >= n):  # this program's part of the item ends here
            npieces = tl.load(pieces_ptr + item * 2 + 1)
            if npieces == 1:
                head_o = item * G + g  # the output is [bs, q_heads, d], contiguous
                tl.store(out_ptr + head_o[:, None] * D + d[None, :], (acc / l[:, None]).to(out_ptr.dtype.element_ty), mask=g_ok[:, None])
            else:
                seg = item + p
                tl.store(part_ptr + (seg * GR + g[:, None]) * D + d[None, :], acc, mask=g_ok[:, None])
                tl.store(ml_ptr + (seg * GR + g) * 2, m, mask=g_ok)
                tl.store(ml_ptr + (seg * GR + g) * 2 + 1, l, mask=g_ok)
                tl.debug_barrier()  # every thread's partials are written before the counter moves
                done = tl.atomic_add(count_ptr + item, 1, sem="acq_rel")
                if done == npieces - 1:
                    if merge_a < 0:
                        merge_a = item
                    else:
                        merge_b = item
    r = tl.arange(0, GR)
    r_ok = r < G
    for which in tl.static_range(2):
        item = merge_a if which == 0 else merge_b
        if item >= 0:  # all of its pieces are written: join them in program order
            first = item + tl.load(pieces_ptr + item * 2)
            npieces = tl.load(pieces_ptr + item * 2 + 1)
            mm = tl.full([GR], float("-inf"), dtype=tl.float32)
            ll = tl.zeros([GR], dtype=tl.float32)
            oo = tl.zeros([GR, D], dtype=tl.float32)
            for s in range(first, first + npieces):
                ms = tl.load(ml_ptr + (s * GR + r) * 2, mask=r_ok, other=float("-inf"), cache_modifier=".cg")
                ls = tl.load(ml_ptr + (s * GR + r) * 2 + 1, mask=r_ok, other=0.0, cache_modifier=".cg")
                ps = tl.load(part_ptr + (s * GR + r[:, None]) * D + d[None, :], mask=r_ok[:, None], other=0.0, cache_modifier=".cg")
                m2 = tl.maximum(mm, ms)
                a1 = tl.exp(mm - m2)
                a2 = tl.exp(ms - m2)
                oo = oo * a1[:, None] + ps * a2[:, None]
                ll = ll * a1 + ls * a2
                mm = m2
            head_r = item * G + r
            tl.store(out_ptr + head_r[:, None] * D + d[None, :], (oo / ll[:, None]).to(out_ptr.dtype.element_ty), mask=r_ok[:, None])
            tl.atomic_xchg(count_ptr + item, 0)  # ready for the next launch




@dataclass(frozen=True)
class StreamShape:
    """Where the plan's parts start in its buffer (fixed for a batch size, so a CUDA graph can hold it)."""

    programs: int
    items: int  # requests x KV heads

    @property
    def pieces_at(self) -> int:
        return self.programs + 1

    @property
    def info_at(self) -> int:
        return self.pieces_at + 2 * self.items


def plan_stream(rows: Sequence[int], kv_lens: Sequence[int], num_kv_heads: int, programs: int, block: int = STREAM_BLOCK) -> np.ndarray:
    """The int32 plan buffer: each program's first tile (`programs + 1` entries; programs past the tiles get
    none), each item's (first program, programs holding a piece), then each tile's (item, row, first key,
    key count). Items are request-major, KV head fastest."""
    lens = np.asarray(kv_lens, dtype=np.int64)
    tiles = np.repeat((lens + block - 1) // block, num_kv_heads)
    first = np.concatenate([[0], np.cumsum(tiles)])
    total = int(first[-1])
    item = np.repeat(np.arange(len(tiles)), tiles)
    b = item // num_kv_heads
    info = np.stack([item, np.asarray(rows, dtype=np.int64)[b], (np.arange(total) - first[item]) * block, lens[b]], axis=1)
    used = max(1, min(programs, total))  # equal runs of tiles; programs past them (never between) get none
    start = np.concatenate([(np.arange(used + 1) * total) // used, np.full(programs - used, total)])
    p_first = np.searchsorted(start, first[:-1], side="right") - 1
    p_last = np.searchsorted(start, first[1:] - 1, side="right") - 1
    pieces = np.stack([p_first, p_last - p_first + 1], axis=1)
    return np.concatenate([start, pieces.ravel(), info.ravel()]).astype(np.int32)


@dataclass
class StreamScratch:
    """Partials and counters for `stream_decode_attention`, sized once for a batch-size limit."""

    part: torch.Tensor  # [(items + programs) * next_pow2(group) * head_dim] float32
    ml: torch.Tensor  # [(items + programs) * next_pow2(group) * 2] float32 (running max, sum)
    count: torch.Tensor  # [items] int32, zero between launches

    @classmethod
    def for_batches(cls, max_bs: int, num_kv_heads: int, group: int, head_dim: int, programs: int, device: torch.device) -> "StreamScratch":
        items = max_bs * num_kv_heads
        cells = (items + programs) * next_pow2(group)
        return cls(torch.empty(cells * head_dim, dtype=torch.float32, device=device),
                   torch.empty(cells * 2, dtype=torch.float32, device=device),
                   torch.zeros(items, dtype=torch.int32, device=device))


def stream_decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, page_table: torch.Tensor, plan: torch.Tensor,
                            shape: StreamShape, scratch: StreamScratch, stages: int = STREAM_STAGES, out: Optional[torch.Tensor] = None,
                            block: int = STREAM_BLOCK, branchless: bool = False) -> torch.Tensor:
    """`decode_attention_ref` for the batch `plan` (from `plan_stream`, on q's device) describes, in one launch
    of `shape.programs` programs. q `[bs, q_heads, d]`; caches `[slots, kv_heads, d]`."""
    q = q.contiguous()
    bs, hq, d = q.shape
    hkv = k_cache.shape[1]
    group = hq // hkv
    assert shape.items == bs * hkv and hq % hkv == 0 and k_cache.stride(2) == 1 and k_cache.stride(1) == d and page_table.stride(1) == 1
    assert scratch.count.numel() >= shape.items
    if out is None:
        out = torch.empty(bs, hq, d, dtype=q.dtype, device=q.device)
    gr = next_pow2(group)
    _stream_kernel[(shape.programs,)](
        q, k_cache, v_cache, page_table, plan, scratch.part, scratch.ml, scratch.count, out,
        q.stride(0), page_table.stride(0), k_cache.stride(0), v_cache.stride(0), 1.0 / math.sqrt(d),
        PIECES_AT=shape.pieces_at, INFO_AT=shape.info_at, HKV=hkv, G=group, GP=max(16, gr), GR=gr, D=d, BT=block, BRANCHLESS=branchless,
        num_warps=4, num_stages=stages,
    )
    return out



def stream_attention(q, kc, vc, table, rows, lens, programs: int, stages: int = 2, block: int = 128, branchless: bool = False):
    """A callable running the stream kernel on this batch with `programs` programs."""
    bs, hq, _ = q.shape
    hkv = kc.shape[1]
    shape = StreamShape(programs, bs * hkv)
    plan = torch.from_numpy(plan_stream(rows, lens, hkv, programs, block)).to(q.device)
    scratch = StreamScratch.for_batches(bs, hkv, hq // hkv, q.shape[2], programs, q.device)
    return lambda: stream_decode_attention(q, kc, vc, table, plan, shape, scratch, stages, block=block, branchless=branchless)


def check(dev: str) -> None:
    """Small cases against the reference (the CPU under TRITON_INTERPRET=1, or the GPU)."""
    from minisgl.kernel import decode_attention_ref
    rng = random.Random(1)
    for bs, programs in ((1, 3), (3, 5), (5, 7), (4, 64)):
        lens = [rng.randint(1, 700) for _ in range(bs)]
        slots = sum(lens) + 8
        table = torch.zeros(bs + 2, 1024, dtype=torch.int32)
        perm = torch.randperm(slots, generator=torch.Generator().manual_seed(bs)).to(torch.int32)
        rws = list(range(2, bs + 2))
        at = 0
        for r, n in zip(rws, lens):
            table[r, :n] = perm[at:at + n]
            at += n
        table = table.to(dev)
        kc = torch.randn(slots, 2, 128, device=dev)
        vc = torch.randn_like(kc)
        q = torch.randn(bs, 4, 128, device=dev)
        want = decode_attention_ref(q, kc, vc, table, torch.tensor(rws), torch.tensor(lens))
        for branchless in (False, True):
            for block in (64, 128):
                got = stream_attention(q, kc, vc, table, rws, lens, programs, block=block, branchless=branchless)()
                err = (got - want).abs().max().item()
                print(f"bs {bs} programs {programs} block {block} branchless {branchless} lens {lens}: max err {err:.1e}")
                assert err < (1e-3 if dev == "cpu" else 2e-2)  # tf32 products on the GPU


# (label, programs per SM, pipeline stages, keys per tile, stores masked instead of a branch)
VARIANTS = [("if 1x128x2", 1, 2, 128, False), ("if 1x128x3", 1, 3, 128, False), ("masked 1x128x2", 1, 2, 128, True),
            ("masked 1x128x3", 1, 3, 128, True), ("masked 2x64x3", 2, 3, 64, True), ("if 2x64x3", 2, 3, 64, False)]


def main() -> None:
    from _timing import graph_us
    from decode_head_order import D, HKV, HQ, batch
    from minisgl.attention.flashinfer_backend import large_decode_splits
    from minisgl.kernel import LARGE_BATCH_BLOCK, LARGE_BATCH_STAGES, DecodeScratch, decode_attention
    dev = torch.device("cuda")
    check("cuda")
    rng = random.Random(0)
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    for bs in (16, 64, 128, 256):
        lens, table, kc, vc, q, rows, kvl = batch(bs, "engine", rng)
        scratch = DecodeScratch.for_batches(bs, HKV, HQ // HKV, D, sms, dev, pieces=bs * 16, rows=bs)
        splits = large_decode_splits(bs, HKV, sms)  # the engine's
        engine = lambda: decode_attention(q, kc, vc, table, rows, kvl, scratch, splits, block=LARGE_BATCH_BLOCK, stages=LARGE_BATCH_STAGES)
        want = engine().float()
        cells = [f"engine ({splits} splits) {graph_us(engine):.1f}"]
        for name, progs, stages, block, branchless in VARIANTS:
            fn = stream_attention(q, kc, vc, table, list(range(bs)), lens, progs * sms, stages, block, branchless)
            err = (fn().float() - want).abs().max().item()
            cells.append(f"{name} {graph_us(fn):.1f} ({err:.0e})")
        gb = sum(lens) * HKV * D * 2 * 2 / 1e9
        print(f"bs {bs:3} ({sum(lens) // bs} keys avg, {gb * 1e3:.0f} MB): " + ", ".join(cells), flush=True)


if __name__ == "__main__":
    if "--check" in sys.argv:
        check("cpu")
    else:
        main()
