"""The offline workload's prefill phase, first run of a fresh process: each step's host time, the GPU's
time from that step's launch to the next one's (events on the stream), and the SM clock and power the
driver reports; with `--profile`, the profiler over the prefill phase only (kernel time, the GPU's busy
span, the host calls that took the most time); with `--cprofile`, Python's own profiler over the same
phase (which Python functions the host's time goes to).
`python tools/gpu_probes/offline_prefill.py [--model DIR] [--profile | --cprofile]`"""
import cProfile
import pstats
import argparse
import os
import time

import torch
from torch.profiler import ProfilerActivity, profile

import minisgl
from minisgl.benchmark import offline as B
from minisgl.scheduler import scheduler as S


def run(llm, workload, label: str, profiled: bool, python_profiled: bool = False) -> None:
    prof = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) if profiled else None
    pyprof = cProfile.Profile() if python_profiled else None
    profiled = profiled or python_profiled
    walls, marks, clocks = [], [], []
    orig = S.Scheduler.step
    state = {"on": profiled}
    nvml = _nvml()

    def step(self):
        t = time.perf_counter()
        n = len(self.trace)
        if self.prefill.pending or self.prefill.chunked or len(marks) < 40:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            marks.append(ev)
            clocks.append(nvml() if nvml else None)
        orig(self)
        new = self.trace[n:]
        walls.append((new[0].phase if new else "-", sum(new[0].extend_lens) if new else 0, time.perf_counter() - t))
        if state["on"] and not (self.prefill.pending or self.prefill.chunked):
            torch.cuda.synchronize()
            if pyprof is not None:
                pyprof.disable()
            if prof is not None:
                prof.stop()
            state["on"] = False

    S.Scheduler.step = step
    try:
        if prof is not None:
            prof.start()
        if pyprof is not None:
            pyprof.enable()
        r = B.run_workload(llm, workload)
    finally:
        S.Scheduler.step = orig
    groups = B.time_by_batch_size(r.trace, r.end, 1, 1, 1.0)
    pre = next(g for g in groups if g.label == "prefill")
    print(f"{label}: {r.seconds:.2f} s; prefill {pre.steps} steps {pre.seconds:.3f} s (launch to launch)")
    torch.cuda.synchronize()
    gpu = [a.elapsed_time(b) for a, b in zip(marks, marks[1:])]
    print("  per step: phase+tokens, host ms in step(), GPU ms from its launch to the next, SM MHz / W")
    for i, (ph, tok, w) in enumerate(walls[: len(gpu)]):
        c = clocks[i]
        print(f"    {ph[0]}{tok:<6} host {w * 1e3:6.1f}  gpu {gpu[i]:6.1f}" + (f"  {c[0]} MHz {c[1]:.0f} W" if c else ""))
    if pyprof is not None:
        stats = pstats.Stats(pyprof)
        stats.sort_stats("tottime").print_stats(25)
        stats.sort_stats("cumulative").print_stats(30)
    if prof is None:
        return
    events = prof.events()
    kernels = [e for e in events if e.device_type == torch.autograd.DeviceType.CUDA]
    if kernels:
        span = (max(e.time_range.end for e in kernels) - min(e.time_range.start for e in kernels)) / 1e6
        busy = sum(e.time_range.elapsed_us() for e in kernels) / 1e6
        print(f"  GPU over the prefill phase: {len(kernels)} kernels/copies, busy {busy:.3f} s within a span of {span:.3f} s")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=22, max_name_column_width=60))
    print(prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=14, max_name_column_width=60))


def _nvml():
    try:
        import pynvml

        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
        return lambda: (pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM), pynvml.nvmlDeviceGetPowerUsage(h) / 1e3)
    except Exception:  # no NVML: the clocks column is left out
        return None


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="models/qwen3-0.6b-dummy")
    ap.add_argument("--profile", action="store_true", help="profile the first run's prefill phase")
    ap.add_argument("--cprofile", action="store_true", help="Python's profiler over the first run's prefill phase")
    a = ap.parse_args()
    print("package:", os.path.dirname(minisgl.__file__))
    llm = B.build_llm(a.model, dummy_weights=not B.has_weights(a.model))
    B.warm_up(llm)
    workload = B.make_workload()
    run(llm, workload, "run 1" + (" (prefill profiled)" if a.profile or a.cprofile else ""), a.profile, a.cprofile)
    B.release(llm)


if __name__ == "__main__":
    main()
