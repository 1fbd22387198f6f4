"""Chapter 19's decode attention built in four steps (chapters/triton_steps.py), each against the torch
attention backend, and the engine's split merge (`minisgl.kernel.decode_merge`, the merge-splits
exercise's reference) against the same backend: under Triton's interpreter on the CPU, compiled on a GPU."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
gpu = pytest.mark.gpu

try:  # a fresh Python under TRITON_INTERPRET=1 imports this module to run the checks below
    import triton
    import triton.language as tl

    from minisgl.kernel import decode_merge

    @triton.jit
    def _merge_alone(part_ptr, ml_ptr, out_ptr, nsplit, HKV: tl.constexpr, G: tl.constexpr, GR: tl.constexpr,
                     D: tl.constexpr, SPLITS: tl.constexpr):
        # one request; one program a KV head, its scratch at [h, SPLITS, GR, ...]
        h = tl.program_id(0)
        decode_merge.merge_splits(part_ptr, ml_ptr, out_ptr, h * SPLITS, nsplit, 0, h, tl.arange(0, D), HKV, G, GR, D,
                                  SPLITS)
except ImportError:  # pragma: no cover - the tests importorskip Triton
    triton = None


def _steps():
    sys.path.insert(0, str(ROOT / "chapters"))
    import triton_steps

    return triton_steps


def _scores(req, start: int = 0, end: int = -1) -> torch.Tensor:
    """q . k / sqrt(d) for the keys `start:end`, query head i against KV head i // group: `[q_heads, keys]`."""
    end = req.n if end < 0 else end
    k, _ = req.caches()
    keys = k[req.table[0, start:end].long()].repeat_interleave(req.group, dim=1)  # [keys, q_heads, d]
    return torch.einsum("hd,nhd->hn", req.q, keys) / math.sqrt(req.q.shape[1])


def step1_checks(device: str) -> None:
    S = _steps()
    for n, page_size in ((11, 4), (16, 1), (1, 4)):
        req = S.random_request(n, page_size, device=device, seed=n)
        scores, out = S.block_scores(req, 16)
        torch.testing.assert_close(scores[:, :n], _scores(req))
        assert torch.isinf(scores[:, n:]).all() and (scores[:, n:] < 0).all()  # past the request: -inf
        torch.testing.assert_close(out, S.torch_attention(req))


def step2_checks(device: str) -> None:
    S = _steps()
    for n, page_size, group in ((1, 4, 2), (16, 1, 2), (70, 4, 2), (70, 16, 1), (45, 4, 4)):
        req = S.random_request(n, page_size, q_heads=2 * group, device=device, seed=n)
        torch.testing.assert_close(S.online_attention(req, 16), S.torch_attention(req))


def step3_checks(device: str) -> None:
    """Each split's partial: its output (weighted values over l) is attention over its own keys, and
    m + log l is their log-sum-exp; a split past the keys leaves m = -inf, l = 0 and no values."""
    S = _steps()
    req = S.random_request(70, 4, device=device)
    for splits in (1, 3, 8):  # any count here; the merge wants a power of two
        part, ml = S.split_partials(req, 16, splits)
        for s, (start, end) in enumerate(S.split_bounds(req.n, 16, splits)):
            m, l = ml[:, s, 0], ml[:, s, 1]
            if start == end:
                assert torch.isinf(m).all() and (m < 0).all() and (l == 0).all() and (part[:, s] == 0).all()
                continue
            torch.testing.assert_close(part[:, s] / l[:, None], S.torch_attention(req, start, end))
            torch.testing.assert_close(m + l.log(), torch.logsumexp(_scores(req, start, end), dim=1))
    assert S.split_bounds(70, 16, 8)[-1] == (70, 70)  # the case above has empty splits


def step4_checks(device: str) -> None:
    S = _steps()
    for n, splits in ((70, 1), (70, 2), (70, 8), (5, 4), (200, 16)):
        req = S.random_request(n, 4, device=device, seed=n + splits)
        part, ml = S.split_partials(req, 16, splits)
        torch.testing.assert_close(S.merge_partials(part, ml), S.torch_attention(req))


def engine_merge_checks(device: str) -> None:
    """The engine's merge_splits, launched alone on partials laid out as the decode kernel's scratch:
    for each split, (m, l, weighted values) over its slice of a request's keys; the merged output must be
    the torch backend's attention over all the keys. Grouped query heads that pad (3 in 4 rows), splits that
    did not run and padded rows holding NaN, and a split with no keys (m = -inf, l = 0)."""
    S = _steps()
    hkv, g, gr, splits = 2, 3, 4, 8
    req = S.random_request(50, 4, q_heads=hkv * g, kv_heads=hkv, device=device)
    bounds = [(0, 20), (20, 20), (20, 41), (41, 50)]  # the second split holds no keys
    part = torch.full((hkv, splits, gr, req.q.shape[1]), float("nan"), device=device)
    ml = torch.full((hkv, splits, gr, 2), float("nan"), device=device)
    for s, (start, end) in enumerate(bounds):
        scores = _scores(req, start, end).view(hkv, g, -1)  # [KV heads, group, keys]
        _, v = req.caches()
        vals = v[req.table[0, start:end].long()].transpose(0, 1)  # [KV heads, keys, d]
        m = scores.amax(-1) if end > start else torch.full((hkv, g), float("-inf"), device=device)
        w = (scores - m[..., None]).exp()
        part[:, s, :g], ml[:, s, :g, 0], ml[:, s, :g, 1] = w @ vals, m, w.sum(-1)
    out = torch.full((1, hkv * g, req.q.shape[1]), 7.0, device=device)
    _merge_alone[(hkv,)](part, ml, out, len(bounds), HKV=hkv, G=g, GR=gr, D=req.q.shape[1], SPLITS=splits)
    torch.testing.assert_close(out[0], S.torch_attention(req))


_INTERPRETED = """
import sys
sys.path.insert(0, {tests!r})
import test_ch19_steps as t
t.{check}("cpu")
print("ok")
"""


def _interpret(check: str) -> None:
    """Run one check in a fresh Python with Triton's interpreter on (it must be on before Triton loads)."""
    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    env.pop("MINISGL_DISABLE_KERNELS", None)
    code = _INTERPRETED.format(tests=str(ROOT / "tests"), check=check)
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stderr[-3000:]


CHECKS = ["step1_checks", "step2_checks", "step3_checks", "step4_checks", "engine_merge_checks"]


@pytest.mark.parametrize("check", CHECKS)
def test_under_the_triton_interpreter(check: str) -> None:
    _interpret(check)


@gpu
@pytest.mark.parametrize("check", CHECKS)
def test_on_a_gpu(check: str) -> None:
    globals()[check]("cuda")


def test_splits_are_whole_blocks_and_the_last_ones_may_be_empty() -> None:
    S = _steps()
    assert S.split_bounds(11, 4, 2) == [(0, 8), (8, 11)]
    assert S.split_bounds(70, 16, 8) == [(0, 16), (16, 32), (32, 48), (48, 64), (64, 70), (70, 70), (70, 70), (70, 70)]
