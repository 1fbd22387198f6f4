"""A decode layer's RoPE (with Qwen3's qk-norm) and KV store folded into the Triton decode kernel, against
the two launches the engine made before (`apply_rope_and_store`, then the decode attention: the Triton
kernel up to 4 and from 64 requests, FlashInfer's decode planned for CUDA graphs in between). At the offline
workload's lengths in the engine's slot layout, q/k/v as views of one projection output; microseconds a
layer, in a CUDA graph. Between 5 and 63 requests it also tries the folded kernel at both tiles and 2-16
splits, from 64 the small tile at 2 and 4 splits too. Each folded variant's output is checked against the two-launch path.
`python tools/gpu_probes/decode_rope_fold.py` (tools/gpu_probes on the path)"""
import random

import torch

from _timing import graph_us
from decode_head_order import D, HKV, HQ, dev, flashinfer_wrapper, qk_rope, rotating_batch
from minisgl.kernel import LARGE_BATCH_BLOCK, LARGE_BATCH_STAGES, DecodeScratch, apply_rope_and_store, decode_attention, decode_splits

LARGE = dict(block=LARGE_BATCH_BLOCK, stages=LARGE_BATCH_STAGES)


def main() -> None:
    rng = random.Random(0)
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    rope, norm = qk_rope()
    for bs in (1, 4, 8, 12, 16, 24, 32, 48, 63, 64, 128, 192, 256):
        lens, table, kc, vc, q, rows, kvl, pending = rotating_batch(bs, rng, rope, norm)
        pos, k, v, loc = pending.positions, pending.k, pending.v, pending.out_loc
        scratch = DecodeScratch.for_batches(bs, HKV, HQ // HKV, D, sms, dev, pieces=bs * 64, rows=bs)

        def rope_then(attend):
            def fn():
                qr = apply_rope_and_store(pos, q, k, v, rope._cos, rope._sin, kc, vc, loc, norm)
                return attend(qr)
            return fn

        if 4 < bs < 64:
            w = flashinfer_wrapper(table, lens)
            paged = (kc.view(-1, 1, HKV, D), vc.view(-1, 1, HKV, D))
            before_name, before = "rope + FlashInfer", rope_then(lambda qr: w.run(qr, paged))
        else:
            splits, tile = (decode_splits(bs, HKV, sms), {}) if bs <= 4 else (2, LARGE)
            before_name = f"rope + Triton ({splits} splits, {'large' if tile else 'small'} tile)"
            before = rope_then(lambda qr: decode_attention(qr, kc, vc, table, rows, kvl, scratch, splits, **tile))
        want = before().clone()
        t_before = graph_us(before)
        t_rope = graph_us(lambda: apply_rope_and_store(pos, q, k, v, rope._cos, rope._sin, kc, vc, loc, norm))
        if bs <= 4:
            setups = [(decode_splits(bs, HKV, sms), "small", {})]
        elif bs >= 64:  # the small tile fits two programs an SM: does it hide the longer start?
            setups = [(2, "large", LARGE), (2, "small", {}), (4, "small", {})]
        else:
            setups = [(s, name, t) for s in (2, 4, 8, 16) for name, t in (("large", LARGE), ("small", {}))]
        cells = []
        for splits, name, tile in setups:
            fn = lambda s=splits, t=tile: decode_attention(q, kc, vc, table, rows, kvl, scratch, s, rope=pending, **t)
            err = (fn().float() - want.float()).abs().max().item()
            cells.append(f"{splits}x{name} {graph_us(fn):.1f} (err {err:.0e})")
        print(f"bs {bs:3} ({sum(lens) // bs} keys avg): {before_name} {t_before:.1f} us (rope alone {t_rope:.1f}) | folded: " + ", ".join(cells), flush=True)


if __name__ == "__main__":
    main()
