"""Where the host's time goes in the offline workload: per decode-size group, the step interval against
the host's own work in a step (the step's wall time less its wait for the GPU), Python's garbage
collections, and a cProfile of one run. `python tools/gpu_probes/offline_host_time.py [--model DIR]`"""
import argparse
import cProfile
import collections
import gc
import pstats
import time

import torch

from minisgl.benchmark import offline as B
from minisgl.scheduler import scheduler as S

WAIT = [0.0]


class TimedEvent(torch.cuda.Event):
    def synchronize(self):
        t = time.perf_counter()
        super().synchronize()
        WAIT[0] += time.perf_counter() - t


def run_timed(llm, workload, label):
    plain = torch.cuda.Event
    torch.cuda.Event = TimedEvent  # the scheduler's per-step event, so its wait can be timed
    steps = []
    orig = S.Scheduler.step

    def step(self):
        WAIT[0] = 0.0
        t = time.perf_counter()
        n = len(self.trace)
        orig(self)
        new = self.trace[n:]
        steps.append((time.perf_counter() - t, WAIT[0], new[0].phase if new else "-", len(new[0].uids) if new else 0))

    S.Scheduler.step = step
    gcs = collections.Counter()
    gct = collections.Counter()
    start = {}

    def cb(phase, info):
        if phase == "start":
            start[0] = time.perf_counter()
        else:
            gcs[info["generation"]] += 1
            gct[info["generation"]] += time.perf_counter() - start[0]

    gc.callbacks.append(cb)
    try:
        r = B.run_workload(llm, workload)
    finally:
        gc.callbacks.remove(cb)
        S.Scheduler.step = orig
        torch.cuda.Event = plain
    print(f"{label}: {r.seconds:.2f} s, {r.tokens_per_s:,.0f} tok/s; gc collections by generation {dict(gcs)}, seconds {{{', '.join(f'{k}: {v:.3f}' for k, v in sorted(gct.items()))}}}")
    groups = collections.defaultdict(lambda: [0, 0.0, 0.0])
    for wall, wait, phase, bs in steps:
        key = "prefill" if phase == "prefill" else ("none" if phase == "-" else f"decode {-(-bs // 64) * 64 - 63}-{-(-bs // 64) * 64}")
        g = groups[key]
        g[0] += 1
        g[1] += wall
        g[2] += wait
    for k in sorted(groups):
        n, wall, wait = groups[k]
        print(f"  {k:<16} {n:5d} steps: host step {wall / n * 1e3:6.3f} ms, of which waiting for the GPU {wait / n * 1e3:6.3f} ms, own work {(wall - wait) / n * 1e3:6.3f} ms")
    return r


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="models/qwen3-0.6b-dummy")
    a = ap.parse_args()
    llm = B.build_llm(a.model, dummy_weights=not B.has_weights(a.model))
    B.warm_up(llm)
    workload = B.make_workload()
    run_timed(llm, workload, "run 1")
    run_timed(llm, workload, "run 2")
    gc.collect()
    gc.freeze()
    run_timed(llm, workload, "run 3, after gc.freeze()")
    gc.disable()
    run_timed(llm, workload, "run 4, gc disabled")
    gc.enable()
    prof = cProfile.Profile()
    prof.enable()
    r = B.run_workload(llm, workload)
    prof.disable()
    print(f"under cProfile: {r.seconds:.2f} s")
    pstats.Stats(prof).sort_stats("tottime").print_stats(35)
    B.release(llm)


if __name__ == "__main__":
    main()
