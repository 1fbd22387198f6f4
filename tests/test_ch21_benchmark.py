"""Chapter 21: benchmarks. The workload is the published one (token totals), the bandwidth floor
counts what a brute-force loop counts, the Hugging Face baseline generates what the engine
generates (float32 greedy), and both benchmark scripts run end to end in their quick mode."""

from __future__ import annotations

import math

import pytest
import torch

from minisgl.benchmark import decode, offline
from minisgl.benchmark.hf_baseline import build_hf_model, hf_continuous_batching, hf_generate


def test_workload_is_nano_vllms():
    w = offline.make_workload()
    assert len(w.prompts) == 256
    assert (w.input_tokens, w.output_tokens) == (142_827, 133_966)
    assert all(100 <= len(p) <= 1024 and all(0 <= t <= 10000 for t in p) for p in w.prompts)
    assert w.head(3).max_tokens == w.max_tokens[:3]


def test_decode_bytes_matches_a_step_by_step_count():
    w = offline.Workload([[1] * 5, [1] * 9, [1] * 2], [3, 1, 6])
    weight, per_token = 1000, 7
    total = 0
    for step in range(1, max(w.max_tokens)):
        total += weight  # every decode step reads the weights once
        for p, m in zip(w.prompts, w.max_tokens):
            if step < m:  # this request is still decoding: it reads its prompt and step tokens
                total += (len(p) + step) * per_token
    assert offline.decode_bytes(w, weight, per_token) == total


def test_hf_baseline_generates_the_engines_tokens(models_dir):
    model = str(models_dir / "tiny-llama")
    w = offline.make_workload(3, 5, 30, 3, 8, seed=4)
    llm = offline.build_llm(model, dummy_weights=False, device="cpu", max_running_reqs=4)
    ours = offline.run_workload(llm, w)
    offline.release(llm)
    hf = build_hf_model(model, torch.float32, torch.device("cpu"), dummy_weights=False)
    base = hf_generate(hf, w.prompts, w.max_tokens)
    assert base.output_tokens == ours.output_tokens == w.output_tokens
    assert base.token_ids == ours.token_ids


@pytest.mark.gpu
def test_hf_continuous_batching_generates_the_engines_tokens(models_dir):
    """transformers' continuous batching (slow on the CPU: minutes for a few tokens) is a fair
    baseline only if it does the same work: float32 greedy, the same tokens as the engine."""
    model = str(models_dir / "tiny-llama")
    w = offline.make_workload(3, 5, 30, 3, 8, seed=4)
    llm = offline.build_llm(model, dummy_weights=False, device="cuda", dtype="float32", max_running_reqs=4)
    ours = offline.run_workload(llm, w)
    offline.release(llm)
    hf = build_hf_model(model, torch.float32, torch.device("cuda"), dummy_weights=False)
    base = hf_continuous_batching(hf, w.prompts, w.max_tokens)
    assert base.output_tokens == ours.output_tokens == w.output_tokens
    assert base.token_ids == ours.token_ids


def test_offline_quick_runs_the_whole_workload():
    result = offline.main(["--quick", "--device", "cpu"])
    w = offline.make_workload(8, 8, 48, 4, 12)
    assert result.output_tokens == w.output_tokens
    assert [len(t) for t in result.token_ids] == w.max_tokens
    assert result.prefill_steps >= 1 and result.decode_steps == max(w.max_tokens) - 1
    assert result.tokens_per_s > 0


def test_decode_quick_reports_every_batch_size():
    results = decode.main(["--quick", "--device", "cpu"])
    assert [(r.batch_size, r.cuda_graph) for r in results] == [(1, False), (4, False)]
    assert all(math.isfinite(r.tpot_s) and r.tpot_s > 0 for r in results)


def test_kernel_profile_groups_by_family_and_averages_over_steps():
    assert decode.kernel_name("void flashinfer::BatchDecodeKernel<128u, 4u>(Params)") == "flashinfer::BatchDecodeKernel"
    assert decode.kernel_name("_rope_kernel") == "_rope_kernel"
    events = [("_rope_kernel", 0.0, 2.0), ("void gemv<1>(int)", 3.0, 10.0), ("Memcpy HtoD (Pinned -> Device)", 10.0, 11.0)]
    p = decode.group_kernels(events + [(n, s + 20, e + 20) for n, s, e in events], steps=2)
    assert p.kernels == 2  # the copy is not a kernel
    assert [(g.name, g.count, g.us) for g in p.groups] == [("gemv", 1, 7.0), ("_rope_kernel", 1, 2.0), ("Memcpy HtoD", 1, 1.0)]
    assert (p.busy_us, p.span_us) == (10.0, 15.5)
    assert "GPU busy 10 us of a 16 us step span" in decode.kernel_table(p)


@pytest.mark.gpu
def test_graphs_make_small_batch_decode_faster():
    results = decode.main(["--batch-sizes", "1", "--input-len", "64", "--steps", "32"])
    by_graph = {r.cuda_graph: r.tpot_s for r in results}
    assert by_graph[True] < by_graph[False]


def test_cpu_benchmark_compares_both_workloads_with_transformers(models_dir):
    from minisgl.benchmark import cpu

    model = str(models_dir / "tiny-llama")
    results = cpu.main(["--model", model, "--prefill-len", "300", "--chat-prompts", "3", "--chat-tokens", "5", "--repeats", "1", "--threads", "1"])
    prefill, chat = results
    assert prefill.same == "same next token"
    assert chat.same == "3/3 requests token-equal"
    assert all(r.engine_s > 0 and r.hf_s > 0 and math.isfinite(r.speedup) for r in results)


def test_cpu_attention_hands_sdpa_a_batch_dimension(models_dir, monkeypatch):
    """3-D inputs send SDPA to its quadratic math path on the CPU; 4-D ones to the fused kernel."""
    import torch.nn.functional as F

    from minisgl.attention import torch_backend
    from minisgl.core import SamplingParams
    from minisgl.llm import LLM

    dims = []
    real = F.scaled_dot_product_attention

    def spy(q, k, v, **kw):
        dims.append(q.dim())
        return real(q, k, v, **kw)

    monkeypatch.setattr(torch_backend.F, "scaled_dot_product_attention", spy)
    llm = LLM(str(models_dir / "tiny-llama"), device="cpu", dtype="float32")
    llm.generate([list(range(5, 40))], SamplingParams(max_tokens=3))
    llm.shutdown()
    assert dims and set(dims) == {4}
