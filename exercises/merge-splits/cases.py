"""Cases for merge-splits: your merge_splits launched alone on random partials laid out as the decode
kernel's scratch (splits that did not run and padded query rows hold NaN, rows that are not yours a
marker), then the engine's whole decode kernel with your merge inside it. On a GPU the kernels are
compiled; without one they run under Triton's interpreter."""

import contextlib
import dataclasses
import os
import random
import sys

import torch

from judge import harness
from judge.api import Obs, case

_CPU = not torch.cuda.is_available()
# Triton reads TRITON_INTERPRET when it loads (and when it defines a kernel): without a GPU it is on while
# Triton loads here, then restored, since the judge's other exercises may share this process
_SWITCHED = _CPU and "triton" not in sys.modules
_BEFORE = os.environ.get("TRITON_INTERPRET")
if _SWITCHED:
    os.environ["TRITON_INTERPRET"] = "1"
try:
    import triton
    import triton.language as tl
finally:
    if _SWITCHED and _BEFORE is None:
        del os.environ["TRITON_INTERPRET"]

from minisgl.kernel import decode_merge  # noqa: E402


@triton.jit
def _merge_alone(part_ptr, ml_ptr, out_ptr, nsplit_ptr, HKV: tl.constexpr, G: tl.constexpr, GR: tl.constexpr,
                 D: tl.constexpr, SPLITS: tl.constexpr):
    # grid (KV head, request), as the decode kernel's programs; the scratch is [bs, HKV, SPLITS, GR, ...]
    h, b = tl.program_id(0), tl.program_id(1)
    decode_merge.merge_splits(part_ptr, ml_ptr, out_ptr, (b * HKV + h) * SPLITS, tl.load(nsplit_ptr + b), b, h,
                              tl.arange(0, D), HKV, G, GR, D, SPLITS)


@contextlib.contextmanager
def _kernels():
    """On a GPU, nothing. Without one, the interpreter for the length of a case: the Triton kernels this
    case reaches (the engine's, yours, the launcher above) were defined with it off, so each is rebuilt as
    an interpreted function, and the engine is told the interpreter is on."""
    if not _CPU:
        yield
        return
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    from minisgl.kernel import decode, util

    if not isinstance(tl.cdiv, InterpretedFunction):
        raise RuntimeError("Triton was loaded before this exercise could switch its interpreter on: grade with "
                           "TRITON_INTERPRET=1 python judge.py merge-splits")
    undo, seen = [], set()

    def interpret(namespace: dict) -> None:
        if id(namespace) in seen:
            return
        seen.add(id(namespace))
        for name, value in list(namespace.items()):
            if isinstance(value, JITFunction):
                undo.append((namespace, name, value))
                namespace[name] = value = InterpretedFunction(value.fn)
            if isinstance(value, InterpretedFunction):
                interpret(value.fn.__globals__)  # the kernels it calls (yours may have helpers)

    for namespace in (globals(), vars(decode), vars(decode_merge)):
        interpret(namespace)
    env, var = util.KERNEL_ENV, os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    util.KERNEL_ENV = dataclasses.replace(env, triton_interpret=True)
    try:
        yield
    finally:
        util.KERNEL_ENV = env
        if var is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = var
        for namespace, name, value in reversed(undo):
            namespace[name] = value


def _next_pow2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def _merge(obs: Obs, tag: str, nsplit, hkv: int, g: int, d: int, splits: int, seed: int, spread: float = 3.0,
           empty=()) -> None:
    """Random partials for len(nsplit) requests; `empty` lists (request, split) pairs that ran on no keys."""
    dev = harness.device()
    gen = torch.Generator().manual_seed(seed)
    bs, gr = len(nsplit), _next_pow2(g)
    m = torch.randn(bs, hkv, splits, gr, generator=gen) * spread
    l = 1 + 4 * torch.rand(bs, hkv, splits, gr, generator=gen)  # at least exp(0) = 1: the max key's own weight
    part = torch.randn(bs, hkv, splits, gr, d, generator=gen) * l[..., None]
    for b, s in empty:
        m[b, :, s], l[b, :, s], part[b, :, s] = float("-inf"), 0.0, 0.0
    for b, n in enumerate(nsplit):  # what no one wrote: the merge must not read it
        m[b, :, n:], l[b, :, n:], part[b, :, n:] = float("nan"), float("nan"), float("nan")
    m[..., g:], l[..., g:], part[..., g:, :] = float("nan"), float("nan"), float("nan")
    ml = torch.stack([m, l], dim=-1).to(dev)
    part = part.to(dev)
    # the output, then room for rows a wrong index may reach, all holding a marker
    buf = torch.full(((bs + 1) * hkv * gr, d), -7.0, device=dev)
    out, past = buf[: bs * hkv * g].view(bs, hkv * g, d), buf[bs * hkv * g :]
    counts = torch.tensor(nsplit, dtype=torch.int32, device=dev)
    with _kernels():
        _merge_alone[(hkv, bs)](part, ml, out, counts, HKV=hkv, G=g, GR=gr, D=d, SPLITS=splits)
    obs.eq(f"{tag}: memory past the output [{bs}, {hkv * g}, {d}] left alone", bool((past == -7.0).all()))
    obs.eq(f"{tag}: output values that are not finite", int((~torch.isfinite(out)).sum()))
    for b in range(bs):
        obs.close(f"{tag}: request {b} ({nsplit[b]} of {splits} splits ran), its {hkv * g} query heads", out[b])


@case("one request, one KV head and query head, two splits", hint=3)
def two_splits(obs: Obs) -> None:
    _merge(obs, "2 splits", [2], hkv=1, g=1, d=16, splits=2, seed=0)


@case("one split: the output is its weighted values over its sum", hint=4)
def one_split(obs: Obs) -> None:
    _merge(obs, "1 split", [1, 1], hkv=2, g=2, d=16, splits=1, seed=1)


@case("grouped query heads: 3 per KV head, kept in 4 rows (the fourth holds NaN)", hint=4)
def grouped(obs: Obs) -> None:
    _merge(obs, "3 query heads a KV head", [4, 4], hkv=2, g=3, d=16, splits=4, seed=2)


@case("splits that did not run hold NaN: only the first nsplit count", hint=1)
def fewer_splits(obs: Obs) -> None:
    _merge(obs, "short requests", [1, 3, 8, 5], hkv=2, g=2, d=16, splits=8, seed=3)


@case("a split that holds no keys (m = -inf, l = 0) weighs nothing", hint=2)
def empty_split(obs: Obs) -> None:
    _merge(obs, "an empty split", [4, 3], hkv=1, g=2, d=16, splits=4, seed=4, empty=[(0, 1), (0, 3), (1, 2)])


@case("64 splits whose maxima lie far apart (exp(m) alone overflows float32)", hint=3)
def far_apart(obs: Obs) -> None:
    _merge(obs, "64 splits, maxima up to about 300 apart", [64, 37], hkv=1, g=2, d=32, splits=64, seed=5, spread=100.0)


@case("random layouts", seeds=3, hint=3)
def random_layouts(obs: Obs, seed: int) -> None:
    rng = random.Random(seed)
    for j in range(2):
        splits, g, hkv = rng.choice([2, 4, 8, 16, 32]), rng.choice([1, 2, 3, 4, 7]), rng.choice([1, 2])
        nsplit = [rng.randint(1, splits) for _ in range(rng.randint(1, 3))]
        empty = [(b, s) for b, n in enumerate(nsplit) for s in range(1, n) if rng.random() < 0.2]
        _merge(obs, f"layout {j}: {hkv} KV heads x {g}, {splits} splits", nsplit, hkv, g, rng.choice([16, 32]), splits,
               rng.randrange(1 << 30), spread=rng.choice([1.0, 10.0]), empty=empty)


def _decode(obs: Obs, tag: str, hq: int, hkv: int, lens, splits_list, seed: int) -> None:
    """The engine's decode kernel over random pages; its last program per (request, KV head) calls your merge."""
    from minisgl.kernel import DecodeScratch, decode_attention

    dev, d = harness.device(), 16
    gen = torch.Generator().manual_seed(seed)
    slots = sum(lens) + 8
    kc = torch.randn(slots, hkv, d, generator=gen).to(dev)
    vc = torch.randn(slots, hkv, d, generator=gen).to(dev)
    perm = torch.randperm(slots, generator=gen)
    table = torch.zeros(len(lens), max(lens), dtype=torch.int32)
    at = 0
    for row, n in enumerate(lens):
        table[row, :n] = perm[at : at + n].to(torch.int32)
        at += n
    table, q = table.to(dev), torch.randn(len(lens), hq, d, generator=gen).to(dev)
    rows = torch.arange(len(lens), dtype=torch.int32, device=dev)
    kv_lens = torch.tensor(lens, dtype=torch.int32, device=dev)
    scratch = DecodeScratch.for_batches(len(lens), hkv, hq // hkv, d, 1 << 20, torch.device(dev))
    with _kernels():
        for splits in splits_list:
            out = decode_attention(q, kc, vc, table, rows, kv_lens, scratch, splits)
            obs.close(f"{tag}, {splits} splits a request: the output", out)


@case("in the engine: the decode kernel with your merge, requests of 1 to 200 keys", hint=1)
def engine_kernel(obs: Obs) -> None:
    _decode(obs, "4 query heads on 2 KV heads", 4, 2, [1, 7, 64, 200], [2, 4, 16], seed=6)


@case("in the engine: grouped query heads that pad (3 per KV head)", hint=4)
def engine_grouped(obs: Obs) -> None:
    _decode(obs, "6 query heads on 2 KV heads", 6, 2, [33, 90], [8], seed=7)
