"""The last stage of split decode attention: the partial results of one request's splits, for one KV
head, merged into its output.

Each split of a request's keys leaves, per query head, its running max `m`, its sum of exponentials
`l` (together its log-sum-exp, `m + log l`) and its weighted values, not yet divided by `l`. The
merge weighs split `s` by `exp(m_s - max_s m_s)`, so the splits' sums are put on one scale before
they are added. The decode kernel (`minisgl.kernel.decode`) calls it from the program that finishes
last; it is a stage of its own, with its own file, because it reads every split's results and no
split's keys.

Imported only where Triton is (the decode kernel's module guards the import).
"""

import triton
import triton.language as tl


@triton.jit
def merge_splits(part_ptr, ml_ptr, out_ptr, base, nsplit, b, h, d, HKV: tl.constexpr, G: tl.constexpr,
                 GR: tl.constexpr, D: tl.constexpr, SPLITS: tl.constexpr):
    """Request b's output for KV head h from the partials of its `nsplit` splits, all at once.

    Split s's partials for query row r (r < G, of the `GR = next_pow2(G)` rows the scratch keeps) are at
    `part_ptr + ((base + s) * GR + r) * D + d` (weighted values, `[D]` float32) and
    `ml_ptr + ((base + s) * GR + r) * 2` (`m`, then `l`); splits `nsplit .. SPLITS-1` did not run and hold
    anything. Writes query head `(b * HKV + h) * G + r` of the contiguous output `[bs, q_heads, D]`."""
    sp = tl.arange(0, SPLITS)
    r = tl.arange(0, GR)
    r_ok = r < G
    ok = (sp[:, None] < nsplit) & r_ok[None, :]  # [SPLITS, GR]: the splits that ran
    ml_at = ml_ptr + ((base + sp[:, None]) * GR + r[None, :]) * 2
    ms = tl.load(ml_at, mask=ok, other=float("-inf"), cache_modifier=".cg")
    ls = tl.load(ml_at + 1, mask=ok, other=0.0, cache_modifier=".cg")
    parts = tl.load(part_ptr + ((base + sp[:, None, None]) * GR + r[None, :, None]) * D + d[None, None, :],
                    mask=ok[:, :, None], other=0.0, cache_modifier=".cg")  # [SPLITS, GR, D]
    m_all = tl.max(ms, axis=0)  # finite: split 0 holds at least one key
    w = tl.exp(ms - m_all[None, :])  # a split that did not run weighs exp(-inf) = 0
    o = tl.sum(w[:, :, None] * parts, axis=0) / tl.sum(w * ls, axis=0)[:, None]
    head_r = (b * HKV + h) * G + r  # the output is contiguous
    tl.store(out_ptr + head_r[:, None] * D + d[None, :], o.to(out_ptr.dtype.element_ty), mask=r_ok[:, None])
