"""Exercise merge-splits (chapter 19): the last stage of the engine's decode attention kernel.

Write `merge_splits`, the `@triton.jit` function that the decode kernel's last program for a
(request, KV head) calls: it turns every split's partial result into that request's output for the
KV head's query heads. The judge puts yours into `minisgl.kernel.decode_merge`, where the engine's
kernel calls it. Grade with `python judge.py merge-splits` (without a GPU the cases run your kernel
under Triton's interpreter).
"""

import triton
import triton.language as tl


@triton.jit
def merge_splits(part_ptr, ml_ptr, out_ptr, base, nsplit, b, h, d, HKV: tl.constexpr, G: tl.constexpr,
                 GR: tl.constexpr, D: tl.constexpr, SPLITS: tl.constexpr):
    """Request b's output for KV head h from the partials of its first `nsplit` splits.

    For split s (0 <= s < SPLITS) and query row r (0 <= r < GR, GR = next_pow2(G)), float32:
      m: the running max of the split's scores      at ml_ptr + ((base + s) * GR + r) * 2
      l: the sum of exp(score - m) over its keys    at ml_ptr + ((base + s) * GR + r) * 2 + 1
      the values weighted by exp(score - m), not yet divided by l, `[D]`
                                                    at part_ptr + ((base + s) * GR + r) * D + d
    `d` is `tl.arange(0, D)`. Only splits s < nsplit ran: the others, and rows r >= G, hold anything
    (do not read them). Split 0 always holds keys; a split that holds none has m = -inf, l = 0.

    Write query head (b * HKV + h) * G + r, for r < G, of the contiguous output `[bs, HKV * G, D]`:
    softmax attention over all the splits' keys together, in out_ptr's dtype. Touch nothing else.
    """
    raise NotImplementedError("merge-splits: write merge_splits")
