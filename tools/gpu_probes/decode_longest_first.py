"""The Triton decode kernel with the batch's requests listed longest first (`order`: the grid's last wave then
holds the shortest programs) or in the order they come, at one, two and four splits of the large-batch tile;
up to 63 requests with the norms, RoPE and KV store folded in, as the engine runs it there. The offline
workload's lengths in the engine's slot layout, q, k and v as views of one projection output; microseconds a
layer, in a CUDA graph. Every listed output must equal the one in request order bit for bit.
`python3 -P tools/gpu_probes/decode_longest_first.py` (tools/gpu_probes and the tree on the path)"""
import random

import torch

from _timing import graph_us
from decode_head_order import D, HKV, HQ, dev, qk_rope, rotating_batch
from minisgl.attention.flashinfer_backend import ROPE_IN_DECODE_MAX_BS
from minisgl.kernel import LARGE_BATCH_BLOCK, LARGE_BATCH_STAGES, DecodeScratch, decode_attention

LARGE = dict(block=LARGE_BATCH_BLOCK, stages=LARGE_BATCH_STAGES)


def main() -> None:
    rng = random.Random(0)
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    rope, norm = qk_rope()
    for bs in (8, 16, 24, 32, 40, 48, 56, 63, 64, 80, 96, 112, 128, 144, 160, 192, 224, 256):
        lens, table, kc, vc, q, rows, kvl, pending = rotating_batch(bs, rng, rope, norm)
        if bs > ROPE_IN_DECODE_MAX_BS:  # the engine rotates and stores first, in the RoPE launch
            pending, q = None, q.contiguous()
        scratch = DecodeScratch.for_batches(bs, HKV, HQ // HKV, D, sms, dev, pieces=bs * 4, rows=bs)
        by_len = torch.argsort(kvl, descending=True, stable=True)
        rows_o, kvl_o, order = rows[by_len], kvl[by_len], by_len.to(torch.int32)
        cells = []
        for splits in (1, 2, 4):
            plain = lambda s=splits: decode_attention(q, kc, vc, table, rows, kvl, scratch, s, rope=pending, **LARGE)
            listed = lambda s=splits: decode_attention(q, kc, vc, table, rows_o, kvl_o, scratch, s, rope=pending, order=order, **LARGE)
            assert torch.equal(plain(), listed()), f"bs {bs}: the order changed the output"
            a, b = graph_us(plain), graph_us(listed)
            cells.append(f"{splits}: {a:6.1f} {b:6.1f}")
        print(f"bs {bs:3} ({sum(lens) // bs:4} keys avg{', rope folded' if pending else ''}) splits: as they come, longest first | " + " | ".join(cells), flush=True)


if __name__ == "__main__":
    main()
