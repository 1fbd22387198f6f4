"""Chapter 2, layers without nn.Module: each op computes what the transformers module computes.

Oracles: transformers' own modules (RMSNorm, MLP activation, rotary embedding with its rope
init functions for default, linear, llama3 and YaRN scaling). `BaseOP` finds its weights by
walking attributes, and names them the way checkpoints do.
"""

from __future__ import annotations

import pytest
import torch

from minisgl.layers.activation import silu_and_mul
from minisgl.layers.base import BaseOP, OPList, empty_weight
from minisgl.layers.embedding import ParallelLMHead, VocabParallelEmbedding
from minisgl.layers.linear import LinearColParallelMerged, LinearQKVMerged, LinearReplicated, LinearRowParallel
from minisgl.layers.norm import RMSNorm
from minisgl.layers.rotary import RotaryEmbedding

CPU = torch.device("cpu")
F32 = torch.float32


@pytest.fixture(autouse=True)
def seeded():
    torch.manual_seed(0)


# ---- BaseOP: weights found by walking attributes ---------------------------------------------


class _Leaf(BaseOP):
    def __init__(self) -> None:
        self.weight = torch.zeros(2, 3)
        self._cache = torch.ones(4)  # private: not a weight


class _Tree(BaseOP):
    def __init__(self) -> None:
        self.proj = _Leaf()
        self.layers = OPList([_Leaf(), _Leaf()])
        self.bias = torch.zeros(3)
        self._tied = self.proj  # a private reference must not duplicate the child's weights


def test_state_dict_names_follow_attributes_and_skip_private_ones():
    assert sorted(_Tree().state_dict()) == ["bias", "layers.0.weight", "layers.1.weight", "proj.weight"]


def test_state_dict_returns_the_live_tensors():
    t = _Tree()
    t.state_dict()["layers.1.weight"].fill_(3.0)
    assert torch.equal(t.layers[1].weight, torch.full((2, 3), 3.0))


def test_load_state_dict_copies_in_place_and_is_strict():
    t = _Tree()
    weight_before = t.proj.weight
    state = {k: torch.randn_like(v) for k, v in t.state_dict().items()}
    t.load_state_dict(state)
    assert t.proj.weight is weight_before and torch.equal(t.proj.weight, state["proj.weight"])
    with pytest.raises(KeyError, match="missing"):
        t.load_state_dict({"bias": torch.zeros(3)})
    with pytest.raises(KeyError, match="unexpected"):
        t.load_state_dict({**state, "extra.weight": torch.zeros(1)})
    with pytest.raises(ValueError, match=r"proj.weight: expected shape \(2, 3\)"):
        t.load_state_dict({**state, "proj.weight": torch.zeros(3, 2)})


def test_oplist_indexes_and_iterates():
    ops = OPList([_Leaf(), _Leaf(), _Leaf()])
    assert len(ops) == 3 and ops[2] is list(ops)[2]
    assert [name for name, _ in ops.named_children()] == ["0", "1", "2"]


def test_empty_weight_has_requested_shape_and_dtype():
    w = empty_weight(3, 4, dtype=torch.bfloat16, device=CPU)
    assert w.shape == (3, 4) and w.dtype == torch.bfloat16


# ---- linear layers (one rank) ------------------------------------------------------------------


def test_linear_layers_compute_x_at_w_transposed_plus_bias():
    x = torch.randn(5, 8)
    for layer in (
        LinearReplicated(8, 6, bias=True, dtype=F32, device=CPU),
        LinearColParallelMerged(8, [4, 4], bias=False, dtype=F32, device=CPU),
        LinearRowParallel(8, 6, bias=True, dtype=F32, device=CPU),
    ):
        for w in layer.state_dict().values():
            w.copy_(torch.randn_like(w))
        bias = getattr(layer, "bias", None)
        torch.testing.assert_close(layer(x), torch.nn.functional.linear(x, layer.weight, bias))


def test_projections_are_f_linear_itself_on_any_device_they_are_given():
    """The layers are the plain reference: no other library, no device branch (a faster product is
    swapped in after loading, chapter 19), so a projection is `F.linear`, bit for bit."""
    x = torch.randn(5, 64)
    for layer in (LinearReplicated(64, 48, bias=True, dtype=F32, device=CPU),
                  LinearQKVMerged(hidden=64, head_dim=16, num_q_heads=4, num_kv_heads=2, dtype=F32, device=CPU)):
        for w in layer.state_dict().values():
            w.copy_(torch.randn_like(w))
        assert torch.equal(layer(x), torch.nn.functional.linear(x, layer.weight, getattr(layer, "bias", None)))


def test_qkv_merged_shape_is_q_then_k_then_v_heads():
    layer = LinearQKVMerged(hidden=64, head_dim=16, num_q_heads=4, num_kv_heads=2, dtype=F32, device=CPU)
    assert layer.weight.shape == ((4 + 2 + 2) * 16, 64)
    assert (layer.num_q_heads, layer.num_kv_heads) == (4, 2)
    assert "bias" not in layer.state_dict()
    with_bias = LinearQKVMerged(64, 16, 4, 2, bias=True, dtype=F32, device=CPU)
    assert with_bias.state_dict()["bias"].shape == (128,)


def test_gate_up_merged_keeps_each_part_size():
    layer = LinearColParallelMerged(32, [48, 48], dtype=F32, device=CPU)
    assert layer.local_sizes == [48, 48] and layer.weight.shape == (96, 32)


# ---- RMSNorm and activation vs transformers ----------------------------------------------------


def test_rmsnorm_matches_transformers():
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    ref = LlamaRMSNorm(48, eps=1e-5)
    ref.weight.data = torch.randn(48)
    ours = RMSNorm(48, 1e-5, dtype=F32, device=CPU)
    ours.load_state_dict({"weight": ref.weight.data})
    x = torch.randn(7, 48) * 3
    torch.testing.assert_close(ours(x), ref(x), rtol=0, atol=1e-6)


def test_rmsnorm_in_bfloat16_normalises_in_float32_like_transformers():
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    ref = LlamaRMSNorm(48, eps=1e-6).to(torch.bfloat16)
    ref.weight.data = torch.randn(48).to(torch.bfloat16)
    ours = RMSNorm(48, 1e-6, dtype=torch.bfloat16, device=CPU)
    ours.load_state_dict({"weight": ref.weight.data})
    x = (torch.randn(7, 48) * 3).to(torch.bfloat16)
    assert torch.equal(ours(x), ref(x))


def test_forward_residual_adds_then_normalises_and_returns_the_sum():
    norm = RMSNorm(16, 1e-6, dtype=F32, device=CPU)
    norm.weight.copy_(torch.randn(16))
    x, res = torch.randn(3, 16), torch.randn(3, 16)
    out, new_res = norm.forward_residual(x, res)
    torch.testing.assert_close(new_res, x + res)
    torch.testing.assert_close(out, norm(x + res))
    out0, res0 = norm.forward_residual(x, None)  # first layer: there is no residual yet
    torch.testing.assert_close(res0, x)
    torch.testing.assert_close(out0, norm(x))


def test_silu_and_mul_matches_the_transformers_mlp():
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaMLP

    cfg = LlamaConfig(hidden_size=16, intermediate_size=24, num_attention_heads=2)
    mlp = LlamaMLP(cfg)
    x = torch.randn(5, 16)
    gate_up = torch.cat([mlp.gate_proj(x), mlp.up_proj(x)], dim=-1)
    torch.testing.assert_close(mlp.down_proj(silu_and_mul(gate_up)), mlp(x))


# ---- rotary embedding vs transformers ----------------------------------------------------------

HEAD_DIM = 64
MAX_POS = 4096
ROPE_CASES = {
    "default": None,
    "linear": {"rope_type": "linear", "factor": 2.0},
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 1024},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024},
    "yarn-betas": {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 512, "beta_fast": 16,
                   "beta_slow": 2},
    # without original_max_position_embeddings transformers takes the model's own context
    "yarn-no-original": {"rope_type": "yarn", "factor": 4.0},
}


def _hf_rotary(theta: float, scaling):
    """transformers' rotary module for a Llama config with this scaling."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    params = {"rope_type": "default", "rope_theta": theta} if scaling is None else {**scaling, "rope_theta": theta}
    cfg = LlamaConfig(hidden_size=HEAD_DIM * 4, num_attention_heads=4, head_dim=HEAD_DIM,
                      max_position_embeddings=MAX_POS, rope_parameters=params)
    return LlamaRotaryEmbedding(cfg)


@pytest.mark.parametrize("case", list(ROPE_CASES))
def test_rotary_cos_sin_match_transformers_rope_init(case):
    """Frequencies (and YaRN's attention factor on cos/sin) equal transformers' for every scaling."""
    scaling, theta = ROPE_CASES[case], 500000.0
    hf = _hf_rotary(theta, scaling)
    ours = RotaryEmbedding(HEAD_DIM, MAX_POS, theta, scaling, CPU)
    positions = torch.tensor([[0, 1, 2, 17, 511, 1024, 2047, 4095]])
    cos, sin = hf(torch.zeros(1, dtype=F32), positions)
    torch.testing.assert_close(ours.cos[positions[0]], cos[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ours.sin[positions[0]], sin[0], rtol=1e-5, atol=1e-5)
    if case.startswith("yarn"):
        assert hf.attention_scaling > 1.0  # the factor is really applied, not just equal to one


@pytest.mark.parametrize("case", ["default", "llama3", "yarn"])
def test_rotary_applied_to_q_and_k_matches_apply_rotary_pos_emb(case):
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    scaling, theta = ROPE_CASES[case], 10000.0
    hf = _hf_rotary(theta, scaling)
    ours = RotaryEmbedding(HEAD_DIM, MAX_POS, theta, scaling, CPU)
    positions = torch.tensor([3, 0, 9, 100, 101])  # arbitrary order: each token has its own position
    q, k = torch.randn(5, 4, HEAD_DIM), torch.randn(5, 2, HEAD_DIM)  # [tokens, heads, head_dim]
    cos, sin = hf(q, positions[None])
    q_ref, k_ref = apply_rotary_pos_emb(q.transpose(0, 1)[None], k.transpose(0, 1)[None], cos, sin)
    q_out, k_out = ours(positions, q, k)
    torch.testing.assert_close(q_out, q_ref[0].transpose(0, 1), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(k_out, k_ref[0].transpose(0, 1), rtol=1e-5, atol=1e-5)


def test_rotary_position_zero_is_identity():
    rot = RotaryEmbedding(32, 16, 10000.0, None, CPU)
    q, k = torch.randn(1, 2, 32), torch.randn(1, 1, 32)
    q0, k0 = rot(torch.tensor([0]), q, k)
    torch.testing.assert_close(q0, q)
    torch.testing.assert_close(k0, k)


def test_unknown_rope_scaling_is_rejected_by_name():
    with pytest.raises(ValueError, match="dynamic"):
        RotaryEmbedding(32, 16, 10000.0, {"rope_type": "dynamic", "factor": 2.0}, CPU)


# ---- embedding and LM head ---------------------------------------------------------------------


def test_embedding_looks_up_rows_and_tied_head_reuses_them():
    emb = VocabParallelEmbedding(50, 8, dtype=F32, device=CPU)
    emb.weight.copy_(torch.randn(50, 8))
    ids = torch.tensor([0, 7, 49])
    torch.testing.assert_close(emb(ids), emb.weight[ids])
    head = ParallelLMHead(50, 8, tie_to=emb, dtype=F32, device=CPU)
    assert head.state_dict() == {}  # tied: no weight of its own to load
    x = torch.randn(2, 8)
    torch.testing.assert_close(head(x), x @ emb.weight.T)


def test_untied_head_has_its_own_weight():
    head = ParallelLMHead(50, 8, tie_to=None, dtype=F32, device=CPU)
    assert list(head.state_dict()) == ["weight"] and head.weight.shape == (50, 8)


# ---- the MLP's one op, attention's q/k step, and which rank counts a model fits ---------------


def test_merged_gate_up_op_is_the_transformers_mlp_before_down():
    """`forward_silu_and_mul` is `silu(x @ gate.T) * (x @ up.T)` for the merged [gate; up] weight."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaMLP

    mlp = LlamaMLP(LlamaConfig(hidden_size=16, intermediate_size=24, num_attention_heads=2))
    gate_up = LinearColParallelMerged(16, [24, 24], dtype=F32, device=CPU)
    gate_up.weight.copy_(torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]))
    x = torch.randn(5, 16)
    with torch.no_grad():
        torch.testing.assert_close(mlp.down_proj(gate_up.forward_silu_and_mul(x)), mlp(x))


def test_qk_norm_rope_is_qwen3s_head_norm_then_rope():
    """Qwen3 normalises each query and key head, then rotates; without norms the step is RoPE alone."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm

    from minisgl.layers.rotary import QKNormRope

    rot = RotaryEmbedding(HEAD_DIM, MAX_POS, 10000.0, None, CPU)
    hf_q, hf_k = Qwen3RMSNorm(HEAD_DIM, eps=1e-6), Qwen3RMSNorm(HEAD_DIM, eps=1e-6)
    q_norm, k_norm = RMSNorm(HEAD_DIM, 1e-6, dtype=F32, device=CPU), RMSNorm(HEAD_DIM, 1e-6, dtype=F32, device=CPU)
    for hf, ours in ((hf_q, q_norm), (hf_k, k_norm)):
        hf.weight.data = torch.randn(HEAD_DIM)
        ours.weight.copy_(hf.weight.data)
    positions = torch.tensor([4, 0, 31, 7])
    q, k = torch.randn(4, 4, HEAD_DIM) * 3, torch.randn(4, 2, HEAD_DIM) * 3  # [tokens, heads, head_dim]
    cos, sin = _hf_rotary(10000.0, None)(q, positions[None])
    with torch.no_grad():
        q_ref, k_ref = apply_rotary_pos_emb(hf_q(q).transpose(0, 1)[None], hf_k(k).transpose(0, 1)[None], cos, sin)
    q_out, k_out = QKNormRope(rot, q_norm, k_norm)(positions, q, k)
    torch.testing.assert_close(q_out, q_ref[0].transpose(0, 1), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(k_out, k_ref[0].transpose(0, 1), rtol=1e-5, atol=1e-5)
    plain = QKNormRope(rot)(positions, q, k)
    for a, b in zip(plain, rot(positions, q, k)):
        assert torch.equal(a, b)


def _layers_split(cfg, tp: int) -> bool:
    """Whether rank 0's attention and MLP projections of `cfg` can be built over `tp` ranks."""
    from minisgl.distributed.info import TPInfo, set_tp_info

    meta = torch.device("meta")
    set_tp_info(TPInfo(0, tp))
    try:
        LinearQKVMerged(cfg.hidden_size, cfg.head_dim, cfg.num_heads, cfg.num_kv_heads, dtype=F32, device=meta)
        LinearRowParallel(cfg.num_heads * cfg.head_dim, cfg.hidden_size, dtype=F32, device=meta)
        LinearColParallelMerged(cfg.hidden_size, [cfg.intermediate_size] * 2, dtype=F32, device=meta)
        LinearRowParallel(cfg.intermediate_size, cfg.hidden_size, dtype=F32, device=meta)
        return True
    except (ValueError, AssertionError):
        return False
    finally:
        set_tp_info(TPInfo())


@pytest.mark.parametrize("name", ["smollm2-135m-instruct", "qwen3-0.6b-dummy", "tiny-llama", "tiny-qwen3"])
def test_layers_split_exactly_where_the_engine_accepts_the_rank_count(name):
    """Chapter 2: a model runs on N ranks only if every layer splits, and SmolLM2's MLP rules out 9
    although its attention alone would split. The engine's up-front check must agree with the layers."""
    from helpers import MODELS
    from minisgl.distributed.split import tp_split_problems
    from minisgl.models import ModelConfig

    cfg = ModelConfig.from_dir(MODELS / name)
    for tp in range(1, 17):
        assert _layers_split(cfg, tp) == (not tp_split_problems(cfg, tp)), f"{name}, tp={tp}"
    if name == "smollm2-135m-instruct":
        assert [tp for tp in range(1, 10) if _layers_split(cfg, tp)] == [1, 3]
        assert any("MLP width 1536" in p for p in tp_split_problems(cfg, 9))
        assert not any("heads" in p for p in tp_split_problems(cfg, 9))  # attention alone would split
