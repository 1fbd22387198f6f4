"""The offline workload under the profiler (CUDA activity only): how much of the run's wall time the GPU
was busy, the idle gaps by size, and the kernel time by kind over the whole run.
`python tools/gpu_probes/offline_gpu_busy.py [--model DIR]`"""
import argparse
import collections
import time

import torch
from torch.profiler import ProfilerActivity, profile

from minisgl.benchmark import offline as B

KINDS = [("attention (Triton decode)", ("_decode_kernel",)), ("attention (FlashInfer decode)", ("BatchDecode",)), ("attention (FlashInfer prefill)", ("BatchPrefill",)),
         ("merge of pieces", ("merge_pieces",)), ("FlashInfer merge", ("Merge", "merge_state")),
         ("projections (GEMM)", ("gemm", "nvjet", "cutlass", "sm90_xmma", "splitKreduce", "Kernel2")),
         ("norms", ("rmsnorm", "norm")), ("RoPE + KV store", ("rope",)), ("SiLU", ("silu",)),
         ("page lists", ("gather_page",)), ("copies", ("Memcpy", "copy", "elementwise", "index")), ("argmax / sampling", ("argmax", "reduce", "sample"))]


def kind(name: str) -> str:
    low = name.lower()
    for label, keys in KINDS:
        if any(k.lower() in low for k in keys):
            return label
    return "other"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="models/qwen3-0.6b-dummy")
    a = ap.parse_args()
    llm = B.build_llm(a.model, dummy_weights=not B.has_weights(a.model))
    B.warm_up(llm)
    workload = B.make_workload()
    r = B.run_workload(llm, workload)
    print(f"unprofiled run: {r.seconds:.2f} s, {r.tokens_per_s:,.0f} tok/s", flush=True)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        r = B.run_workload(llm, workload)
        wall = time.perf_counter() - t0
    print(f"profiled run: {r.seconds:.2f} s, {r.tokens_per_s:,.0f} tok/s", flush=True)
    evs = []
    by_kind = collections.Counter()
    names = collections.Counter()
    for e in prof.profiler.kineto_results.events():
        if e.device_type() != torch.autograd.DeviceType.CUDA:
            continue
        s, d = e.start_ns(), e.duration_ns()
        evs.append((s, s + d, e.name()[:40]))
        by_kind[kind(e.name())] += d
        names[e.name()[:90]] += d
    evs.sort()
    busy, gaps = 0, collections.Counter()
    gap_n = collections.Counter()
    around = collections.Counter()  # gaps of 10 us and more: what ran before and after, and when in the run
    around_n = collections.Counter()
    when = collections.Counter()
    cur_s, cur_e, cur_name = evs[0]
    for s, e, name in evs[1:]:
        if s > cur_e:
            busy += cur_e - cur_s
            g = s - cur_e
            b = "<2 us" if g < 2e3 else "2-10 us" if g < 1e4 else "10-100 us" if g < 1e5 else "0.1-1 ms" if g < 1e6 else ">1 ms"
            gaps[b] += g
            gap_n[b] += 1
            if g >= 1e4:
                around[(cur_name, name)] += g
                around_n[(cur_name, name)] += 1
                when[int((cur_e - evs[0][0]) / 2.5e8)] += g
            cur_s, cur_e, cur_name = s, e, name
        else:
            if e > cur_e:
                cur_e, cur_name = e, name
    busy += cur_e - cur_s
    span = evs[-1][1] - evs[0][0]
    print(f"GPU activity from first to last: {span / 1e9:.3f} s; busy {busy / 1e9:.3f} s ({busy / span:.1%}); {len(evs)} activities; host wall {wall:.3f} s")
    for b in ("<2 us", "2-10 us", "10-100 us", "0.1-1 ms", ">1 ms"):
        print(f"  idle gaps {b:>9}: {gap_n[b]:7d}, {gaps[b] / 1e9:.3f} s")
    print("gaps of 10 us and more by the activities on either side:")
    for (a, b), t in around.most_common(12):
        print(f"  {t / 1e9:7.3f} s in {around_n[(a, b)]:5d}  after {a!r} before {b!r}")
    print("gaps of 10 us and more by quarter second of the run: " + ", ".join(f"{k * 0.25:.2f}s {t / 1e6:.0f}ms" for k, t in sorted(when.items())))
    total = sum(by_kind.values())
    print(f"activity time by kind (sum {total / 1e9:.3f} s):")
    for k, t in by_kind.most_common():
        print(f"  {k:<32} {t / 1e9:7.3f} s  {t / total:6.1%}")
    print("top activities:")
    for n, t in names.most_common(25):
        print(f"  {t / 1e9:7.3f} s  {n}")
    B.release(llm)


if __name__ == "__main__":
    main()
