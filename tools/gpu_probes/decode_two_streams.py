"""Two half-batches decoding at once on two CUDA streams, against one decode step for the whole batch.

The question: a decode step's attention reads keys at near the copy rate while its projections, norms and
RoPE wait on their own latency, so would two halves of the batch, one in its attention while the other
runs the rest of its layer, take less than the whole batch at once? Two engines in one process (each its
own KV pool and CUDA graphs), every request `KEYS` prompt tokens long; each engine's graph for the
current batch is replayed repeatedly (the plan of the last real step is reused, so only the GPU is timed).
The second stream can start late by a sleep kernel (`d50k`: about 50,000 cycles), once, so that the two
halves run out of phase; `hi-prio` puts the second half on a high-priority stream.

    python tools/gpu_probes/decode_two_streams.py [KEYS]     # default 700
"""
import random
import sys
import time

import torch

from minisgl.benchmark.build import build_llm, sync
from minisgl.benchmark.offline import warm_up
from minisgl.core import SamplingParams

KEYS = int(sys.argv[1]) if len(sys.argv) > 1 else 700


def engine(max_bs: int):
    llm = build_llm("models/qwen3-0.6b-dummy", dummy_weights=True, max_running_reqs=256, cuda_graph_max_bs=max_bs, num_pages=420_000)
    warm_up(llm)
    return llm


def settle(llm) -> None:
    """Step until the last three steps were decode steps of every request."""
    for _ in range(4):
        llm.step()
    while any(t.phase != "decode" for t in llm.trace[-3:]):
        llm.step()
    sync(llm)


def fill(llm, bs: int, seed: int):
    rng = random.Random(seed)
    # max_tokens small enough that all requests fit the pool at once (admission reserves them)
    uids = [llm.add_request([rng.randint(0, 10000) for _ in range(KEYS)], SamplingParams(max_tokens=400, ignore_eos=True)) for _ in range(bs)]
    settle(llm)
    return uids


def cut(llm, uids, keep: int):
    for u in uids[keep:]:
        llm.abort_request(u)
    settle(llm)
    return uids[:keep]


def graph(llm, bs: int):
    assert len(llm.trace[-1].uids) == bs, (len(llm.trace[-1].uids), bs)  # the graph's plan is this batch's
    runner = llm.engine.graph_runner
    return runner.graphs[runner.padded_size(bs)]


def timed(jobs, iters: int = 40) -> float:
    """ms per round of `jobs` (graph, stream, sleep cycles before its first replay), the second of two passes."""
    for _ in range(2):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for i in range(iters):
            for g, s, delay in jobs:
                with torch.cuda.stream(s):
                    if i == 0 and delay:
                        torch.cuda._sleep(delay)
                    g.replay()
        torch.cuda.synchronize()
    return (time.perf_counter() - t0) / iters * 1e3


A, B = engine(256), engine(128)
sa, sb, high = torch.cuda.Stream(), torch.cuda.Stream(), torch.cuda.Stream(priority=-1)
ua = fill(A, 256, 1)
print(f"keys {KEYS}: whole 256: {timed([(graph(A, 256), sa, 0)]):.3f} ms", flush=True)
ua = cut(A, ua, 192)
t192 = timed([(graph(A, 192), sa, 0)])
ua = cut(A, ua, 128)
t128 = timed([(graph(A, 128), sa, 0)])
print(f"whole 192: {t192:.3f} ms; whole 128: {t128:.3f} ms", flush=True)
ub = fill(B, 128, 2)
for n in (128, 96, 64):
    if n != 128:
        ua, ub = cut(A, ua, n), cut(B, ub, n)
    ga, gb = graph(A, n), graph(B, n)
    res = [f"{n} alone {timed([(ga, sa, 0)]):.3f}"]
    for d in (0, 50_000, 100_000, 200_000):
        res.append(f"d{d // 1000}k {timed([(ga, sa, 0), (gb, sb, d)]):.3f}")
    res.append(f"hi-prio d100k {timed([(ga, sa, 0), (gb, high, 100_000)]):.3f}")
    print(f"{n}+{n} on two streams: " + ", ".join(res), flush=True)
