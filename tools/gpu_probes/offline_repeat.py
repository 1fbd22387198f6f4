"""The offline workload run several times in one process, after the benchmark's own warm-up: how much
of a run's time is paid once (compilation, first allocations) and where each run's time went, the
prefill steps one by one. Imports whichever `minisgl` comes first on the path, so it can time another
copy of the package (`offline_ab.sh` with `SCRIPT=tools/gpu_probes/offline_repeat.py`).
`python tools/gpu_probes/offline_repeat.py [--model DIR] [--runs 2]`"""
import argparse
from pathlib import Path

import minisgl
from minisgl.benchmark import offline as B


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="models/qwen3-0.6b-dummy")
    ap.add_argument("--runs", type=int, default=2)
    a = ap.parse_args()
    print(f"package: {Path(minisgl.__file__).parent}")
    llm = B.build_llm(a.model, dummy_weights=not B.has_weights(a.model))
    B.warm_up(llm)
    workload = B.make_workload()
    for i in range(a.runs):
        r = B.run_workload(llm, workload)
        print(f"run {i + 1}: {r.seconds:.2f} s, {r.tokens_per_s:,.0f} output tok/s")
        steps = [(t, nxt) for t, nxt in zip(r.trace, [*(t.launched_at for t in r.trace[1:]), r.end])]
        pre = [f"{(nxt - t.launched_at) * 1e3:.1f}" for t, nxt in steps if t.phase == "prefill"]
        print(f"  prefill steps (ms): {' '.join(pre)}")
        if llm.engine.device.type == "cuda":  # the benchmark's own floor and groups (its copy rate is a GPU measurement)
            B._print_floor(llm, workload, r)
    B.release(llm)


if __name__ == "__main__":
    main()
