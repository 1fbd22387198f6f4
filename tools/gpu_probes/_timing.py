"""The probes' one timing rule: `fn` called `inner` times inside a CUDA graph (captured on a side
stream after one warm call), the graph replayed once untimed and then `reps` times between events."""
import torch


def graph_us(fn, inner: int = 4, reps: int = 30) -> float:
    """Microseconds per call of `fn`."""
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        fn()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(inner):
                fn()
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(True), torch.cuda.Event(True)
    g.replay()
    e0.record()
    for _ in range(reps):
        g.replay()
    e1.record()
    torch.cuda.synchronize()
    return e0.elapsed_time(e1) * 1e3 / reps / inner
