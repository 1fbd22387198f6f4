"""Chapter 20: mixture of experts.

Oracles: transformers' Qwen3-MoE (router, experts, whole model greedy), a per-token float64 loop
for the expert mixture, and a plain-Python `moe_align_block_size`. GPU tests check the Triton
fused kernel against the PyTorch path.
"""

from __future__ import annotations

import random
from typing import List

import pytest
import torch

from helpers import MODELS, ReferenceCache, build_llm, hf_logits, load_rank
from minisgl.core import SamplingParams
from minisgl.distributed.split import check_tp_split, tp_split_problems
from minisgl.models import ModelConfig, MoeModelConfig, load_checkpoint, supported_architectures
from minisgl.models.llama import Qwen3ForCausalLM
from minisgl.moe import moe_align_block_size, moe_align_block_size_ref, moe_forward_torch, select_experts

MOE = MODELS / "tiny-qwen3-moe"
PROMPTS: List[List[int]] = [[1, 500, 23, 99, 1000], [7, 8, 9], list(range(100, 137))]
REFS = ReferenceCache()


def random_routing(tokens: int, experts: int, top_k: int, gen: torch.Generator) -> torch.Tensor:
    """`[tokens, top_k]` distinct experts per token, as a router picks them."""
    return torch.stack([torch.randperm(experts, generator=gen)[:top_k] for _ in range(tokens)]) if tokens else torch.zeros(0, top_k, dtype=torch.long)


# ---- moe_align_block_size -----------------------------------------------------------------------


def _check_aligned(topk_ids: torch.Tensor, block: int, experts: int, device: str = "cpu") -> None:
    got = moe_align_block_size(topk_ids.to(device), block, experts)
    want = moe_align_block_size_ref(topk_ids, block, experts)
    assert torch.equal(got.sorted_ids.cpu(), want.sorted_ids), "sorted_ids differ"
    assert torch.equal(got.expert_ids.cpu(), want.expert_ids), "expert_ids differ"
    assert torch.equal(got.num_padded.cpu(), want.num_padded)


def test_moe_align_docstring_example():
    got = moe_align_block_size(torch.tensor([[2], [0], [2], [2], [2]]), 4, 3)
    used = got.num_padded.item()
    assert got.sorted_ids[:used].tolist() == [1, 5, 5, 5, 0, 2, 3, 4]
    assert got.expert_ids[: used // 4].tolist() == [0, 2] and (got.expert_ids[used // 4 :] == -1).all()


def test_moe_align_matches_naive_reference_on_random_cases():
    rng = random.Random(0)
    gen = torch.Generator().manual_seed(0)
    for _ in range(60):
        experts = rng.choice([1, 3, 8, 60])
        top_k = rng.randint(1, min(experts, 8))
        tokens = rng.choice([0, 1, 2, 5, 17, 100, 257])
        block = rng.choice([1, 4, 16, 64])
        ids = random_routing(tokens, experts, top_k, gen)
        _check_aligned(ids, block, experts)
    # skewed routing: every token to the same few experts (most groups empty)
    _check_aligned(torch.tensor([[5, 6]] * 33), 16, 8)


# ---- router and expert mixture --------------------------------------------------------------------


@pytest.mark.parametrize("renormalize", [True, False])
def test_router_matches_transformers(renormalize):
    from transformers import Qwen3MoeConfig
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeTopKRouter

    cfg = Qwen3MoeConfig(hidden_size=32, num_experts=8, num_experts_per_tok=3, norm_topk_prob=renormalize)
    router = Qwen3MoeTopKRouter(cfg)
    torch.manual_seed(0)
    torch.nn.init.normal_(router.weight)
    x = torch.randn(20, 32)
    with torch.no_grad():
        logits, hf_weights, hf_ids = router(x)
    weights, ids = select_experts(logits, 3, renormalize)
    assert torch.equal(ids, hf_ids)
    torch.testing.assert_close(weights, hf_weights, rtol=0, atol=0)


def naive_moe(x, w13, w2, weights, ids) -> torch.Tensor:
    """Token by token, choice by choice, in float64."""
    out = torch.zeros(x.shape, dtype=torch.float64)
    inter = w13.shape[1] // 2
    for t in range(x.shape[0]):
        for k in range(ids.shape[1]):
            e = int(ids[t, k])
            h = w13[e].double() @ x[t].double()
            a = torch.nn.functional.silu(h[:inter]) * h[inter:]
            out[t] += float(weights[t, k]) * (w2[e].double() @ a)
    return out


def test_torch_moe_matches_per_token_loop():
    gen = torch.Generator().manual_seed(1)
    tokens, hidden, inter, experts, top_k = 13, 24, 10, 6, 2
    x = torch.randn(tokens, hidden, generator=gen)
    w13 = torch.randn(experts, 2 * inter, hidden, generator=gen) * 0.3
    w2 = torch.randn(experts, hidden, inter, generator=gen) * 0.3
    weights, ids = select_experts(torch.randn(tokens, experts, generator=gen), top_k, True)
    got = moe_forward_torch(x, w13, w2, weights, ids)
    torch.testing.assert_close(got.double(), naive_moe(x, w13, w2, weights, ids), rtol=1e-5, atol=1e-5)


# ---- the model --------------------------------------------------------------------------------------


def test_qwen3_moe_is_registered():
    assert "Qwen3MoeForCausalLM" in supported_architectures()


@pytest.mark.parametrize("rank,size", [(0, 1), (1, 2)])
def test_loader_stacks_and_shards_experts(rank, size):
    """Every expert's gate/up/down land in the stacked tensors; at TP=2 each rank keeps its half
    of every expert's inner width (loading needs no collectives, so rank 1 loads right here)."""
    cfg = MoeModelConfig.from_dir(MOE)
    model, ckpt = load_rank(MOE, rank, size)
    n = cfg.moe_intermediate_size // size
    rows = slice(rank * n, (rank + 1) * n)
    block = model.model.layers[1].mlp
    assert tuple(block.experts.gate_up_proj.shape) == (cfg.num_experts, 2 * n, cfg.hidden_size)
    for e in range(cfg.num_experts):
        p = f"model.layers.1.mlp.experts.{e}."
        gate_up = torch.cat([ckpt[p + "gate_proj.weight"][rows], ckpt[p + "up_proj.weight"][rows]])
        assert torch.equal(block.experts.gate_up_proj[e], gate_up)
        assert torch.equal(block.experts.down_proj[e], ckpt[p + "down_proj.weight"][:, rows])
    assert torch.equal(block.gate.weight, ckpt["model.layers.1.mlp.gate.weight"])


def test_a_dense_model_class_refuses_the_expert_weights_by_name():
    """config.json naming the dense Qwen3 class over a MoE checkpoint: the loader names the first
    tensor it has no place for and says what to check, instead of a shape error further on."""
    dense = Qwen3ForCausalLM(ModelConfig.from_dir(MOE), torch.float32, torch.device("cpu"))
    with pytest.raises(KeyError, match=r"mlp\.experts\.0\..*has no place in Qwen3ForCausalLM.*does not declare.*"
                                       r"Qwen3MoeForCausalLM"):
        load_checkpoint(dense, MOE)


def _shape(**moe) -> ModelConfig:
    return ModelConfig.from_dict({"architectures": ["Qwen3MoeForCausalLM"], "vocab_size": 64, "hidden_size": 64,
                                  "num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 8,
                                  "intermediate_size": 12, "num_experts": 4, "num_experts_per_tok": 2,
                                  "moe_intermediate_size": 6, **moe})


def test_tp_split_checks_the_expert_width_and_the_dense_mlp_only_where_a_layer_has_one():
    all_sparse = _shape()
    assert tp_split_problems(all_sparse, 2) == []
    assert tp_split_problems(all_sparse, 4) == ["expert width 6 does not split over 4 ranks"]  # MLP width 12 unused
    one_dense = _shape(mlp_only_layers=[0])
    assert tp_split_problems(one_dense, 8) == ["MLP width 12 does not split over 8 ranks",
                                               "expert width 6 does not split over 8 ranks"]
    with pytest.raises(ValueError, match=r"tp_size=4: expert width 6 .*Sizes up to 8 that work .*: \[1, 2\]"):
        check_tp_split(all_sparse, 4)


def test_qwen3_moe_greedy_equals_transformers():
    want = [REFS.get(MOE, p, 8, stop_at_eos=False) for p in PROMPTS]
    llm = build_llm(MOE, max_extend_tokens=16)  # the 37-token prompt goes in three chunks
    outs = llm.generate(PROMPTS, SamplingParams(max_tokens=8, ignore_eos=True))
    llm.assert_all_free()
    assert [o.token_ids for o in outs] == want


def test_qwen3_moe_tp2_over_gloo_equals_transformers():
    want = [REFS.get(MOE, p, 8, stop_at_eos=False) for p in PROMPTS]
    llm = build_llm(MOE, tp_size=2, overlap=True)
    try:
        outs = llm.generate(PROMPTS, SamplingParams(max_tokens=8, ignore_eos=True))
        llm.assert_all_free()
    finally:
        llm.shutdown()
    assert [o.token_ids for o in outs] == want


# ---- GPU: the Triton fused kernel -------------------------------------------------------------------


@pytest.mark.gpu
def test_moe_align_on_cuda_matches_reference():
    rng = random.Random(1)
    gen = torch.Generator().manual_seed(1)
    for _ in range(20):
        experts = rng.choice([8, 60, 128])
        top_k = rng.choice([1, 2, 8])
        ids = random_routing(rng.choice([1, 3, 64, 300]), experts, top_k, gen)
        _check_aligned(ids, rng.choice([16, 64]), experts, device="cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("tokens,hidden,inter,experts,top_k", [(1, 128, 64, 8, 2), (7, 256, 96, 60, 4), (300, 512, 128, 16, 2), (64, 2048, 768, 128, 8)])
def test_triton_fused_moe_matches_torch(dtype, tokens, hidden, inter, experts, top_k):
    from minisgl.moe.triton_moe import fused_moe

    gen = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(tokens, hidden, device="cuda", generator=gen).to(dtype)
    w13 = (torch.randn(experts, 2 * inter, hidden, device="cuda", generator=gen) / hidden**0.5).to(dtype)
    w2 = (torch.randn(experts, hidden, inter, device="cuda", generator=gen) / inter**0.5).to(dtype)
    weights, ids = select_experts(torch.randn(tokens, experts, device="cuda", generator=gen).to(dtype), top_k, True)
    want = moe_forward_torch(x.float(), w13.float(), w2.float(), weights.float(), ids)
    got = fused_moe(x, w13, w2, weights, ids).float()
    tol = 1e-4 if dtype == torch.float32 else 3e-2
    err = (got - want).abs().max().item() / want.abs().max().item()
    assert err < tol, f"relative error {err:.2e} (dtype {dtype})"


@pytest.mark.gpu
def test_qwen3_moe_on_cuda_with_triton_equals_transformers():
    llm = build_llm(MOE, device="cuda", attention_backend="torch")
    assert llm.engine.model.model.layers[0].mlp.experts._backend == "triton"
    outs = llm.generate(PROMPTS, SamplingParams(max_tokens=8, ignore_eos=True))
    for prompt, out in zip(PROMPTS, outs):
        # each token is transformers' argmax given all before it (one pass, no KV cache API)
        logits = hf_logits(MOE, prompt + out.token_ids[:-1])[len(prompt) - 1 :]
        assert logits.argmax(-1).tolist() == out.token_ids


# ---- the MoE benchmark -------------------------------------------------------------------------------
def test_moe_benchmark_checks_then_times_and_counts_the_experts_read():
    from minisgl.benchmark import moe as bench

    results = bench.main(["--quick", "--device", "cpu"])
    assert [(r.backend, r.tokens) for r in results] == [("torch", 1), ("torch", 16)]
    per_expert = (2 * 32 * 64 + 64 * 32) * 4  # w13 and w2 of one expert, float32
    assert results[0].weight_bytes == 2 * per_expert, "one token with top 2 reads exactly two experts"
    assert per_expert * 2 <= results[1].weight_bytes <= per_expert * 8
    assert all(r.seconds > 0 and r.rel_error == 0.0 and r.graph_seconds is None for r in results)


@pytest.mark.gpu
def test_moe_benchmark_runs_both_backends_on_cuda():
    from minisgl.benchmark import moe as bench

    results = bench.main(["--tokens", "1,300", "--hidden", "256", "--inter", "96", "--experts", "16", "--top-k", "4"])
    assert [(r.backend, r.tokens) for r in results] == [("torch", 1), ("triton", 1), ("torch", 300), ("triton", 300)]
    assert all(r.rel_error < 3e-2 and r.seconds > 0 for r in results)
    assert all((r.graph_seconds is not None) == (r.backend == "triton") for r in results), "Triton is also timed as a graph"
