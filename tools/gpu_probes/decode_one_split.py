"""The Triton decode kernel at 64-256 requests with each request's keys in one split (the program writes the
output itself, no partials, counter or merge) against two and four splits (the last program merges), at the
large-batch and the small-batch tile. The offline workload's lengths in the engine's slot layout;
microseconds a layer, in a CUDA graph; every variant's output checked against two splits at the large tile.
`python tools/gpu_probes/decode_one_split.py` (tools/gpu_probes on the path)"""
import random

import torch

from _timing import graph_us
from decode_head_order import D, HKV, HQ, batch, dev
from minisgl.kernel import LARGE_BATCH_BLOCK, LARGE_BATCH_STAGES, DecodeScratch, decode_attention

LARGE = dict(block=LARGE_BATCH_BLOCK, stages=LARGE_BATCH_STAGES)


def main() -> None:
    rng = random.Random(0)
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    for bs in (64, 96, 128, 160, 192, 224, 256):
        lens, table, kc, vc, q, rows, kvl = batch(bs, "engine", rng)
        scratch = DecodeScratch.for_batches(bs, HKV, HQ // HKV, D, sms, dev, pieces=bs * 4, rows=bs)
        want = decode_attention(q, kc, vc, table, rows, kvl, scratch, 2, **LARGE).float()
        cells = []
        for splits in (1, 2, 4):
            for name, tile in (("large", LARGE), ("small", {})):
                fn = lambda s=splits, t=tile: decode_attention(q, kc, vc, table, rows, kvl, scratch, s, **t)
                err = (fn().float() - want).abs().max().item()
                cells.append(f"{splits}x{name} {graph_us(fn):.1f} ({err:.0e})")
        print(f"bs {bs:3} ({sum(lens) // bs} keys avg): " + ", ".join(cells), flush=True)


if __name__ == "__main__":
    main()
