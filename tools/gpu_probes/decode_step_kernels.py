"""Decode steps of the engine at fixed shapes: wall per step, and the profiler's kernel table.

In every run so far the wall time of the 40 steps timed right after the prefill came out about twice
the kernels' time, which the offline benchmark's own per-step times do not show: read the kernel table,
and treat that wall figure with suspicion until it is explained.
"""
import random, sys, time, collections, torch
from torch.autograd import DeviceType
from minisgl.core import SamplingParams
from minisgl.benchmark.build import build_llm, sync
from minisgl.benchmark.offline import warm_up
opts = dict(a.split("=") for a in sys.argv[1:])
opts = {k: (int(v) if v.isdigit() else v) for k, v in opts.items()}
llm = build_llm("models/qwen3-0.6b-dummy", dummy_weights=True, **opts)
warm_up(llm)
def short(name):
    for key in ("BatchDecode", "BatchPrefill", "Merge", "nvjet", "gemm", "gemv", "rope", "rms", "silu", "store", "decode_kernel", "argmax", "softmax", "index", "copy", "fill", "elementwise"):
        if key.lower() in name.lower():
            return key + ":" + name[:60]
    return name[:70]
for bs, n in [(256, 600), (128, 900), (64, 1200), (32, 1500)]:
    rng = random.Random(bs)
    uids = [llm.add_request([rng.randint(0, 10000) for _ in range(n)], SamplingParams(max_tokens=4000, ignore_eos=True)) for _ in range(bs)]
    while len(llm.trace) < 3 or any(t.phase != "decode" for t in llm.trace[-3:]):
        llm.step()
    sync(llm); t0 = time.perf_counter()
    for _ in range(40): llm.step()
    sync(llm); wall = (time.perf_counter() - t0) / 40
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(20): llm.step()
        sync(llm)
    agg = collections.defaultdict(lambda: [0.0, 0])
    for e in prof.events():
        if e.device_type == DeviceType.CUDA:
            a = agg[short(e.name)]; a[0] += e.device_time_total if hasattr(e, "device_time_total") else e.cuda_time_total; a[1] += 1
    tot = sum(v[0] for v in agg.values()) / 20
    print(f"== {bs} x {n}: wall {wall*1e3:.3f} ms/step, kernels {tot/1e3:.3f} ms/step, {sum(v[1] for v in agg.values())/20:.0f} kernels/step")
    for k, (us, c) in sorted(agg.items(), key=lambda kv: -kv[1][0])[:18]:
        print(f"   {us/20:8.1f} us/step  {c/20:6.1f}/step  {k}")
    for u in uids: llm.abort_request(u)
    while not llm.is_idle: llm.step()
