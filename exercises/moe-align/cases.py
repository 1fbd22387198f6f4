"""Cases for moe-align: the alignment of scripted and random routings against the exact layout,
with structural checks in the learner's terms (every row once, one expert per block), and the
MoE layers of tiny-qwen3-moe computed tile by tile from your alignment."""

import random

import torch

from judge import harness
from judge.api import E2E, Obs, case, snapshot


def _align(obs: Obs, topk_ids, block_size: int, num_experts: int, tag: str):
    from minisgl.moe import align

    before = snapshot(topk_ids)
    out = align.moe_align_block_size(topk_ids, block_size, num_experts)
    obs.unchanged(f"{tag}: topk_ids", before, topk_ids)
    obs.eq(f"{tag}: dtypes of sorted_ids, expert_ids, num_padded", [str(out.sorted_ids.dtype), str(out.expert_ids.dtype), str(out.num_padded.dtype)])
    obs.eq(f"{tag}: block_size", out.block_size)
    rows = topk_ids.numel()
    sid, eid, n = out.sorted_ids.cpu(), out.expert_ids.cpu(), int(out.num_padded.reshape(-1)[0])
    used = sid[:n]
    obs.eq(f"{tag}: every row appears exactly once among the first num_padded entries",
           sorted(used[used < rows].tolist()) == list(range(rows)))
    flat = topk_ids.flatten().cpu()
    pure = [all(int(flat[r]) == int(eid[b]) for r in sid[b * block_size : (b + 1) * block_size].tolist() if r < rows) for b in range(n // block_size)]
    obs.eq(f"{tag}: each used block's rows belong to that block's expert", all(pure) and n % block_size == 0)
    obs.eq(f"{tag}: num_padded", n)
    obs.eq(f"{tag}: sorted_ids", sid)
    obs.eq(f"{tag}: expert_ids", eid)
    return out


@case("the docstring's example: 5 tokens, top-1, 3 experts, blocks of 4", hint=1)
def example(obs: Obs) -> None:
    _align(obs, torch.tensor([[2], [0], [2], [2], [2]]), 4, 3, "example")


@case("top-2 routing: rows are t*top_k + k", hint=2)
def top2(obs: Obs) -> None:
    _align(obs, torch.tensor([[1, 2], [1, 0], [0, 4], [4, 1], [3, 0], [7, 6]]), 4, 8, "6 tokens, top-2")


@case("experts with no rows take no blocks; block size 1 means no padding", hint=3)
def edges(obs: Obs) -> None:
    ids = torch.tensor([[5, 0], [5, 0], [5, 3]])
    _align(obs, ids, 4, 8, "experts 1, 2, 4, 6, 7 idle")
    _align(obs, ids, 1, 8, "block size 1")
    _align(obs, ids, 16, 8, "block larger than all rows")


@case("one token (a decode step of one request), top-8 of 16 experts", hint=3)
def one_token(obs: Obs) -> None:
    _align(obs, torch.tensor([[15, 3, 9, 0, 7, 12, 1, 4]]), 4, 16, "one token, top-8")


@case("random routings, block sizes and expert counts", seeds=4, hint=4)
def random_routings(obs: Obs, seed: int) -> None:
    rng = random.Random(seed)
    for j in range(3):
        experts = rng.choice([2, 4, 8, 16, 64])
        top_k = rng.randint(1, min(4, experts))
        tokens = rng.randint(1, 40)
        ids = torch.tensor([rng.sample(range(experts), top_k) for _ in range(tokens)])
        _align(obs, ids, rng.choice([1, 2, 4, 8, 16]), experts, f"routing {j}: {tokens} tokens, top-{top_k} of {experts}")


@case("tiny-qwen3-moe: every MoE layer computed tile by tile from your alignment", kind=E2E, hint=4, timeout_s=120)
def model_layers(obs: Obs) -> None:
    from chapters.stage4 import blockwise_moe
    from minisgl.models import MoeModelConfig, create_model, load_checkpoint
    from minisgl.moe import align, moe_forward_torch, select_experts

    path = harness.model_path("tiny-qwen3-moe")
    cfg = MoeModelConfig.from_dir(path)
    model = create_model(cfg, torch.float32, torch.device("cpu"))
    load_checkpoint(model, path)
    gen = torch.Generator().manual_seed(0)
    for i, layer in enumerate(model.model.layers):
        moe = layer.mlp
        for tokens, block in ((1, 4), (5, 2), (37, 8)):
            x = torch.randn(tokens, cfg.hidden_size, generator=gen)
            weights, ids = select_experts(moe.gate(x), cfg.num_experts_per_tok, cfg.norm_topk_prob)
            aligned = align.moe_align_block_size(ids, block, cfg.num_experts)
            w13, w2 = moe.experts.gate_up_proj, moe.experts.down_proj
            tiled = blockwise_moe(x, w13, w2, weights, ids, aligned)
            tag = f"layer {i}, {tokens} tokens, blocks of {block}"
            obs.eq(f"{tag}: tile-by-tile output equals the loop over experts", bool(torch.allclose(tiled, moe_forward_torch(x, w13, w2, weights, ids), atol=1e-5)))
            obs.close(f"{tag}: tile-by-tile output", tiled)
