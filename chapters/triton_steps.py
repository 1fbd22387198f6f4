"""Chapter 19 builds decode attention in Triton in four steps, each a short kernel checked against the
torch backend's attention (the plain layer math of chapter 5):

1. `block_scores`: one block of a request's keys, read through the page table, scored against one query
   head, and (for a request that fits in the block) its softmax-weighted values;
2. `online_attention`: every block of the request in a loop, with a running max and sum (online softmax);
3. `split_partials`: the blocks cut into splits, one program a split, each writing its partial result;
4. `merge_partials`: the splits' partials merged into the output.

One program serves one query head and adds products with `tl.sum`; the engine's kernel
(`minisgl.kernel.decode`) serves every query head of a KV head at once with `tl.dot`, and requests too.
Caches are the pool's `[slots, kv_heads, head_dim]`; `table` is one page-table row (position -> slot).
"""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass
from typing import List, Tuple

import torch
import triton
import triton.language as tl

from minisgl.attention.torch_backend import TorchAttnBackend, TorchAttnMetadata
from minisgl.kvcache.mha_pool import MHAKVCache

# on a GPU the kernels compile for CUDA tensors; without one they need Triton's interpreter (TRITON_INTERPRET=1)
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


# ---- step 1: one block of keys ----------------------------------------------------------------------
@triton.jit
def _block_kernel(q_ptr, k_ptr, v_ptr, table_ptr, scores_ptr, out_ptr, n, k_stride, sm_scale,
                  G: tl.constexpr, D: tl.constexpr, BT: tl.constexpr):
    hq = tl.program_id(0)  # this program's query head
    h = hq // G  # the KV head it reads (G query heads share one)
    d = tl.arange(0, D)
    t = tl.arange(0, BT)  # positions 0 .. BT-1 of the request
    t_ok = t < n
    slot = tl.load(table_ptr + t, mask=t_ok, other=0).to(tl.int64)  # the page table: position -> slot
    q = tl.load(q_ptr + hq * D + d)  # [D]
    k = tl.load(k_ptr + slot[:, None] * k_stride + h * D + d[None, :], mask=t_ok[:, None], other=0.0)  # [BT, D]
    v = tl.load(v_ptr + slot[:, None] * k_stride + h * D + d[None, :], mask=t_ok[:, None], other=0.0)
    scores = tl.sum(q[None, :] * k, axis=1) * sm_scale  # [BT]
    scores = tl.where(t_ok, scores, float("-inf"))  # a position past the request weighs nothing
    tl.store(scores_ptr + hq * BT + t, scores)
    p = tl.exp(scores - tl.max(scores, axis=0))
    tl.store(out_ptr + hq * D + d, tl.sum(p[:, None] * v, axis=0) / tl.sum(p, axis=0))


# ---- step 2: every block, online softmax --------------------------------------------------------------
@triton.jit
def _attend_keys(q, k_ptr, v_ptr, table_ptr, k_stride, h, d, start, end, sm_scale, D: tl.constexpr,
                 BT: tl.constexpr):
    """Keys `start:end` of the request, a block at a time: (running max m, sum of exponentials l,
    values weighted by exp(score - m), not yet divided by l)."""
    m = tl.full([1], float("-inf"), dtype=tl.float32)
    l = tl.zeros([1], dtype=tl.float32)
    acc = tl.zeros([D], dtype=tl.float32)
    for t0 in range(start, end, BT):
        t = t0 + tl.arange(0, BT)
        t_ok = t < end
        slot = tl.load(table_ptr + t, mask=t_ok, other=0).to(tl.int64)
        k = tl.load(k_ptr + slot[:, None] * k_stride + h * D + d[None, :], mask=t_ok[:, None], other=0.0)
        v = tl.load(v_ptr + slot[:, None] * k_stride + h * D + d[None, :], mask=t_ok[:, None], other=0.0)
        scores = tl.where(t_ok, tl.sum(q[None, :] * k, axis=1) * sm_scale, float("-inf"))
        m_new = tl.maximum(m, tl.max(scores, axis=0))
        p = tl.exp(scores - m_new)  # this block's weights, on the new scale
        alpha = tl.exp(m - m_new)  # what the old sums are worth on the new scale
        acc = acc * alpha + tl.sum(p[:, None] * v, axis=0)
        l = l * alpha + tl.sum(p, axis=0)
        m = m_new
    return m, l, acc


@triton.jit
def _online_kernel(q_ptr, k_ptr, v_ptr, table_ptr, out_ptr, n, k_stride, sm_scale, G: tl.constexpr,
                   D: tl.constexpr, BT: tl.constexpr):
    hq = tl.program_id(0)
    d = tl.arange(0, D)
    q = tl.load(q_ptr + hq * D + d)
    m, l, acc = _attend_keys(q, k_ptr, v_ptr, table_ptr, k_stride, hq // G, d, 0, n, sm_scale, D, BT)
    tl.store(out_ptr + hq * D + d, acc / l)


# ---- step 3: splits, each writing a partial ------------------------------------------------------------
@triton.jit
def _split_kernel(q_ptr, k_ptr, v_ptr, table_ptr, part_ptr, ml_ptr, n, k_stride, sm_scale, G: tl.constexpr,
                  D: tl.constexpr, BT: tl.constexpr, SPLITS: tl.constexpr):
    hq, s = tl.program_id(0), tl.program_id(1)  # query head, split
    chunk = tl.cdiv(tl.cdiv(n, SPLITS), BT) * BT  # whole blocks per split
    start = s * chunk
    d = tl.arange(0, D)
    q = tl.load(q_ptr + hq * D + d)
    m, l, acc = _attend_keys(q, k_ptr, v_ptr, table_ptr, k_stride, hq // G, d, start, tl.minimum(start + chunk, n),
                             sm_scale, D, BT)  # a split past the keys loops zero times: m = -inf, l = 0
    at = hq * SPLITS + s
    tl.store(part_ptr + at * D + d, acc)
    tl.store(ml_ptr + at * 2 + tl.arange(0, 1), m)
    tl.store(ml_ptr + at * 2 + 1 + tl.arange(0, 1), l)


# ---- step 4: the merge ----------------------------------------------------------------------------------
@triton.jit
def _merge_kernel(part_ptr, ml_ptr, out_ptr, D: tl.constexpr, SPLITS: tl.constexpr):
    hq = tl.program_id(0)
    at = hq * SPLITS + tl.arange(0, SPLITS)  # this head's partials, every split at once
    d = tl.arange(0, D)
    m, l = tl.load(ml_ptr + at * 2), tl.load(ml_ptr + at * 2 + 1)  # [SPLITS]
    acc = tl.load(part_ptr + at[:, None] * D + d[None, :])  # [SPLITS, D]
    scale = tl.exp(m - tl.max(m, axis=0))  # each split's sums brought to the largest max; exp(-inf) = 0
    tl.store(out_ptr + hq * D + d, tl.sum(scale[:, None] * acc, axis=0) / tl.sum(scale * l, axis=0))


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


# ---- launches -------------------------------------------------------------------------------------------
@dataclass
class Request:
    """One decoding request: its query heads and its keys in a paged pool, read through a page-table row."""

    q: torch.Tensor  # [q_heads, head_dim]
    pool: MHAKVCache  # one layer
    table: torch.Tensor  # [1, positions] int32: the slot of each position
    n: int  # keys the request attends to

    @property
    def group(self) -> int:
        return self.q.shape[0] // self.pool.num_kv_heads

    def caches(self) -> Tuple[torch.Tensor, torch.Tensor]:
        return self.pool.k_cache(0), self.pool.v_cache(0)


def random_request(n: int, page_size: int = 4, q_heads: int = 4, kv_heads: int = 2, head_dim: int = 16,
                   seed: int = 0, device: str = DEVICE) -> Request:
    """A request of `n` keys on randomly chosen pages of a pool with random contents (float32)."""
    g = torch.Generator().manual_seed(seed)
    pages = _cdiv(n, page_size)
    pool = MHAKVCache(1, 2 * pages + 2, page_size, kv_heads, head_dim, torch.float32, torch.device(device))
    pool.buffer.copy_(torch.randn(pool.buffer.shape, generator=g))
    chosen = torch.randperm(2 * pages + 2, generator=g)[:pages]
    slots = (chosen[:, None] * page_size + torch.arange(page_size)).flatten()[:n]
    q = torch.randn(q_heads, head_dim, generator=g).to(device)
    return Request(q, pool, slots[None, :].to(torch.int32).to(device), n)


def torch_attention(req: Request, start: int = 0, end: int = -1) -> torch.Tensor:
    """The torch backend's decode attention over keys `start:end` of the request: `[q_heads, head_dim]`."""
    end = req.n if end < 0 else end
    row = req.table[:, start:end]
    meta = TorchAttnMetadata([0], [end - start - 1], [end - start], row.long(), torch.ones_like(row, dtype=torch.bool))
    return TorchAttnBackend(req.pool, row)._decode(req.q[None], 0, meta)[0]


def _args(req: Request):
    k, v = req.caches()
    return req.q, k, v, req.table, req.n, k.stride(0), 1.0 / math.sqrt(req.q.shape[1])


def block_scores(req: Request, block: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """Step 1: (scores `[q_heads, block]`, -inf past the request; output `[q_heads, head_dim]`)."""
    hq, d = req.q.shape
    scores, out = req.q.new_empty(hq, block), req.q.new_empty(hq, d)
    q, k, v, table, n, stride, scale = _args(req)
    _block_kernel[(hq,)](q, k, v, table, scores, out, n, stride, scale, G=req.group, D=d, BT=block)
    return scores, out


def online_attention(req: Request, block: int) -> torch.Tensor:
    """Step 2: `[q_heads, head_dim]`, one program a query head looping over the blocks."""
    hq, d = req.q.shape
    out = req.q.new_empty(hq, d)
    q, k, v, table, n, stride, scale = _args(req)
    _online_kernel[(hq,)](q, k, v, table, out, n, stride, scale, G=req.group, D=d, BT=block)
    return out


def split_partials(req: Request, block: int, splits: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """Step 3: (weighted values `[q_heads, splits, head_dim]`, (m, l) `[q_heads, splits, 2]`)."""
    hq, d = req.q.shape
    part, ml = req.q.new_empty(hq, splits, d), req.q.new_empty(hq, splits, 2)
    q, k, v, table, n, stride, scale = _args(req)
    _split_kernel[(hq, splits)](q, k, v, table, part, ml, n, stride, scale, G=req.group, D=d, BT=block, SPLITS=splits)
    return part, ml


def merge_partials(part: torch.Tensor, ml: torch.Tensor) -> torch.Tensor:
    """Step 4: `[q_heads, head_dim]` from step 3's partials."""
    hq, splits, d = part.shape
    if splits & (splits - 1):
        raise ValueError(f"{splits} splits: the merge loads them with tl.arange, so use a power of two")
    out = part.new_empty(hq, d)
    _merge_kernel[(hq,)](part, ml, out, D=d, SPLITS=splits)
    return out


def split_bounds(n: int, block: int, splits: int) -> list:
    """The keys `(start, end)` of each split, as `_split_kernel` (and the engine's kernel) cut them."""
    chunk = _cdiv(_cdiv(n, splits), block) * block
    return [(min(s * chunk, n), min((s + 1) * chunk, n)) for s in range(splits)]


def listing(name: str) -> str:
    """The source of one of this module's kernels, to read in the chapter."""
    fn = globals()[name]
    return inspect.getsource(getattr(fn, "fn", fn)).rstrip()


def splits_figure(n: int, block: int, splits: int, m: List[float], lse: List[float]):
    """Keys cut into splits (each a program), each split's partial (m, log-sum-exp), and the merge."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyArrowPatch, Rectangle

    colors = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#b07aa1", "#76b7b2", "#edc948", "#9c755f"]
    bounds = split_bounds(n, block, splits)
    fig, ax = plt.subplots(figsize=(11, 3.8))
    ax.set_xlim(-1, n + 1), ax.set_ylim(-0.2, 4.2), ax.axis("off")
    for s, (a, b) in enumerate(bounds):
        for t in range(a, b):
            ax.add_patch(Rectangle((t, 3.2), 1, 0.6, facecolor=colors[s % len(colors)], edgecolor="white", lw=0.5))
    for t0 in range(0, n, block):
        ax.plot([t0, t0], [3.1, 3.9], color="#333", lw=1)
    ax.text(n / 2, 4.0, f"{n} keys of one request, read through the page table in blocks of {block} (black lines)",
            ha="center", fontsize=9)
    width = (n + 2) / splits
    for s, (a, b) in enumerate(bounds):
        x = -1 + s * width + 0.1
        empty = a == b
        ax.add_patch(Rectangle((x, 1.5), width - 0.2, 1.0, facecolor="#eeeeee" if empty else colors[s % len(colors)],
                               alpha=0.35, edgecolor="#333", lw=0.8))
        keys = "no keys" if empty else f"keys {a}-{b - 1}"
        ax.text(x + (width - 0.2) / 2, 2.0, f"program {s}\n{keys}\nm={m[s]:.2f}\nlse={lse[s]:.2f}", ha="center",
                va="center", fontsize=7)
        if not empty:
            ax.add_patch(FancyArrowPatch(((a + b) / 2, 3.15), (x + (width - 0.2) / 2, 2.55), arrowstyle="-|>",
                                         mutation_scale=8, color="#555", lw=0.8))
        ax.add_patch(FancyArrowPatch((x + (width - 0.2) / 2, 1.45), (n / 2, 0.75), arrowstyle="-|>", mutation_scale=8,
                                     color="#555", lw=0.6))
    ax.add_patch(Rectangle((n / 2 - 13, 0.05), 26, 0.65, facecolor="#d9ead3", edgecolor="#333", lw=0.8))
    ax.text(n / 2, 0.37, "merge: weigh split s by exp(m_s - max m), add, divide", ha="center", va="center", fontsize=8)
    ax.set_title(f"One query head's attention cut into {splits} splits, one program each, then merged", fontsize=10)
    fig.tight_layout()
    return fig
