"""Chapter 3, models and streaming weights.

Claims: the config reader agrees with transformers'; our modules are named exactly as the
checkpoint is (after q/k/v and gate/up are merged); the streaming loader puts every checkpoint
tensor in its place, so the merged matrices equal transformers' separate ones; one decoder
layer computes what transformers' decoder layer computes; mistakes (unknown architecture,
missing, extra or misshapen tensors) raise errors that say what is wrong.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from helpers import SMOLLM2, TINY_LLAMA, TINY_QWEN2, TINY_QWEN3, build_engine, engine_logits, fill_batch, hf_model, make_req, map_rows
from minisgl.core import Batch, set_global_ctx
from minisgl.models import ModelConfig, create_model, load_checkpoint, load_dummy, register_model, supported_architectures
from minisgl.models.llama import LlamaForCausalLM
from minisgl.models.weight import checkpoint_names

CPU = torch.device("cpu")
ALL_MODELS = [SMOLLM2, TINY_LLAMA, TINY_QWEN2, TINY_QWEN3]
TINY_MODELS = [TINY_LLAMA, TINY_QWEN2, TINY_QWEN3]
_MERGE = {"q_proj": "qkv_proj", "k_proj": "qkv_proj", "v_proj": "qkv_proj", "gate_proj": "gate_up_proj", "up_proj": "gate_up_proj"}


def _ids(paths):
    return [p.name for p in paths]


def _ours(path: Path):
    cfg = ModelConfig.from_dir(path)
    model = create_model(cfg, torch.float32, CPU)
    load_checkpoint(model, path)
    return model


# ---- config ----------------------------------------------------------------------------------


@pytest.mark.parametrize("path", ALL_MODELS, ids=_ids(ALL_MODELS))
def test_model_config_reads_what_transformers_reads(path):
    from transformers import AutoConfig

    hf = AutoConfig.from_pretrained(str(path))
    ours = ModelConfig.from_dir(path)
    assert ours.architecture == hf.architectures[0]
    assert (ours.vocab_size, ours.hidden_size, ours.intermediate_size) == (hf.vocab_size, hf.hidden_size, hf.intermediate_size)
    assert (ours.num_layers, ours.num_heads, ours.num_kv_heads) == (hf.num_hidden_layers, hf.num_attention_heads, hf.num_key_value_heads)
    assert ours.head_dim == getattr(hf, "head_dim", None) or hf.hidden_size // hf.num_attention_heads
    assert ours.rms_norm_eps == hf.rms_norm_eps
    assert ours.rope_theta == hf.rope_parameters["rope_theta"]
    assert ours.max_position_embeddings == hf.max_position_embeddings
    assert ours.tie_word_embeddings == hf.tie_word_embeddings
    assert hf.eos_token_id in ours.eos_token_ids


def test_qwen2_has_qkv_bias_and_qwen3_has_qk_norm():
    assert ModelConfig.from_dir(TINY_QWEN2).attention_bias
    assert not ModelConfig.from_dir(TINY_QWEN3).attention_bias
    names = create_model(ModelConfig.from_dir(TINY_QWEN3), torch.float32, CPU).state_dict()
    assert "model.layers.0.self_attn.q_norm.weight" in names and "model.layers.0.self_attn.k_norm.weight" in names


# ---- names and the loader ---------------------------------------------------------------------


@pytest.mark.parametrize("path", ALL_MODELS, ids=_ids(ALL_MODELS))
def test_state_dict_names_are_checkpoint_names_after_merging(path):
    cfg = ModelConfig.from_dir(path)
    ours = set(create_model(cfg, torch.float32, CPU).state_dict())
    expected = set()
    for name in checkpoint_names(path):
        if name == "lm_head.weight" and cfg.tie_word_embeddings:
            continue
        expected.add(re.sub(r"\.(q_proj|k_proj|v_proj|gate_proj|up_proj)\.", lambda m: f".{_MERGE[m.group(1)]}.", name))
    assert ours == expected


@pytest.mark.parametrize("path", [SMOLLM2, *TINY_MODELS], ids=_ids([SMOLLM2, *TINY_MODELS]))
def test_loaded_weights_equal_transformers_weights(path):
    """Merged q|k|v and gate|up are the checkpoint's separate matrices stacked; all else is copied."""
    ours = _ours(path).state_dict()
    hf = dict(hf_model(path).named_parameters())
    for name, tensor in ours.items():
        if ".qkv_proj." in name:
            parts = [hf[name.replace("qkv_proj", p)] for p in ("q_proj", "k_proj", "v_proj")]
        elif ".gate_up_proj." in name:
            parts = [hf[name.replace("gate_up_proj", p)] for p in ("gate_proj", "up_proj")]
        else:
            parts = [hf[name]]
        assert torch.equal(tensor, torch.cat(parts)), name


def test_load_dummy_gives_unit_norms_and_small_random_weights():
    model = create_model(ModelConfig.from_dir(TINY_QWEN3), torch.float32, CPU)
    load_dummy(model, seed=1)
    state = model.state_dict()
    assert torch.equal(state["model.norm.weight"], torch.ones_like(state["model.norm.weight"]))
    w = state["model.layers.0.mlp.down_proj.weight"]
    assert 0.01 < w.std() < 0.03 and torch.isfinite(w).all()


# ---- one decoder layer vs transformers ---------------------------------------------------------


@pytest.mark.parametrize("path", TINY_MODELS + [SMOLLM2], ids=_ids(TINY_MODELS + [SMOLLM2]))
def test_decoder_layer_matches_transformers_layer(path):
    """Same weights, same hidden states in: same hidden states out (ours returns the MLP output and
    the residual separately, so the layer's output is their sum)."""
    engine = build_engine(path)
    hf = hf_model(path)
    n = 11
    torch.manual_seed(0)
    x = torch.randn(n, hf.config.hidden_size)
    positions = torch.arange(n)
    cos, sin = hf.model.rotary_emb(x[None], positions[None])
    with torch.inference_mode():
        ref = hf.model.layers[1](x[None], attention_mask=None, position_ids=positions[None], position_embeddings=(cos, sin))
    ref = ref[0] if isinstance(ref, tuple) else ref

    req = make_req(list(range(n)), row=0)
    map_rows(engine.page_table, engine.page_size, [req], [n], engine.num_pages)
    batch = Batch(reqs=[req], phase="prefill")

    fill_batch(batch, engine.page_table)
    set_global_ctx(engine.ctx)
    engine.attn_backend.prepare_metadata(batch)
    with torch.inference_mode(), engine.ctx.forward_batch(batch):
        out, residual = engine.model.model.layers[1](x.to(engine.device), None)
    # float32 on both sides; on the CPU the engine's projections run through oneDNN and
    # transformers' through MKL, the same products summed in another order (a few ulps apart)
    torch.testing.assert_close((out + residual).cpu(), ref[0], rtol=1e-4, atol=5e-5)


# ---- errors ----------------------------------------------------------------------------------


def test_unknown_architecture_names_the_supported_ones(tmp_path):
    cfg = json.loads((TINY_LLAMA / "config.json").read_text())
    cfg["architectures"] = ["FancyNewForCausalLM"]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="FancyNewForCausalLM.*supported: .*LlamaForCausalLM"):
        create_model(ModelConfig.from_dir(tmp_path), torch.float32, CPU)


def test_config_without_architecture_is_rejected(tmp_path):
    cfg = json.loads((TINY_LLAMA / "config.json").read_text())
    del cfg["architectures"]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="architecture"):
        ModelConfig.from_dir(tmp_path)


def test_missing_config_says_how_to_build_the_models(tmp_path):
    with pytest.raises(FileNotFoundError, match="prepare_models"):
        ModelConfig.from_dir(tmp_path)


def test_register_model_adds_an_architecture():
    register_model("MyLlamaForCausalLM", LlamaForCausalLM)
    assert "MyLlamaForCausalLM" in supported_architectures()


def _copy_model(src: Path, dst: Path, edit) -> Path:
    for f in src.iterdir():
        if f.suffix != ".safetensors":
            shutil.copy(f, dst / f.name)
    tensors = load_file(str(src / "model.safetensors"))
    edit(tensors)
    save_file(tensors, str(dst / "model.safetensors"))
    return dst


def _fresh(path: Path):
    return create_model(ModelConfig.from_dir(path), torch.float32, CPU)


def test_missing_checkpoint_tensor_is_reported(tmp_path):
    path = _copy_model(TINY_LLAMA, tmp_path, lambda t: t.pop("model.layers.1.self_attn.v_proj.weight"))
    with pytest.raises(KeyError, match=r"model\.layers\.1\.self_attn\.qkv_proj\.weight"):
        load_checkpoint(_fresh(path), path)


def test_extra_checkpoint_tensor_is_reported(tmp_path):
    path = _copy_model(TINY_LLAMA, tmp_path, lambda t: t.__setitem__("model.layers.0.mystery.weight", torch.zeros(2)))
    with pytest.raises(KeyError, match="mystery"):
        load_checkpoint(_fresh(path), path)


def test_misshapen_checkpoint_tensor_is_reported(tmp_path):
    def shrink(t):
        t["model.norm.weight"] = t["model.norm.weight"][:-1].clone()

    path = _copy_model(TINY_LLAMA, tmp_path, shrink)
    with pytest.raises(ValueError, match=r"model\.norm\.weight: expected shape"):
        load_checkpoint(_fresh(path), path)


def test_folder_without_safetensors_is_reported(tmp_path):
    shutil.copy(TINY_LLAMA / "config.json", tmp_path / "config.json")
    with pytest.raises(FileNotFoundError, match="safetensors"):
        load_checkpoint(_fresh(tmp_path), tmp_path)


# ---- rope scaling read from config.json, end to end ---------------------------------------------

SCALED = {
    "llama3": (TINY_LLAMA, {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                            "high_freq_factor": 4.0, "original_max_position_embeddings": 256}),
    "yarn": (TINY_QWEN3, {"rope_type": "yarn", "rope_theta": 1000000.0, "factor": 4.0,
                          "original_max_position_embeddings": 512}),
}


@pytest.mark.parametrize("kind", list(SCALED))
def test_scaled_rope_model_matches_transformers(kind, tmp_path):
    """A model whose config.json asks for llama3 or YaRN scaling: the whole model's logits match."""
    from transformers import AutoConfig, AutoModelForCausalLM

    base, rope = SCALED[kind]
    cfg = AutoConfig.from_pretrained(str(base))
    cfg.rope_parameters = rope
    cfg.initializer_range = 0.1  # larger weights: attention (and so the rotary) visibly moves the logits
    torch.manual_seed(0)
    hf = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
    hf.save_pretrained(str(tmp_path))
    assert ModelConfig.from_dir(tmp_path).rope_scaling["rope_type"] == kind
    ids = list(range(1000, 1300, 7))  # 43 tokens
    with torch.inference_mode():
        ref = hf(input_ids=torch.tensor([ids])).logits[0, -1]
    engine = build_engine(tmp_path)
    req = make_req(ids, row=0)
    map_rows(engine.page_table, engine.page_size, [req], [len(ids)], engine.num_pages)
    got = engine_logits(engine, [req], "prefill")[0]
    torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4)


# ---- what the model asks of its attention backend ----------------------------------------------


class _WholeSequenceBackend:
    """Chapter 3's stand-in, recording its calls: nothing but `forward(q, k, v, layer_id, batch, qk)`,
    which applies the layer's qk step and attends causally over one request's own tokens."""

    def __init__(self) -> None:
        self.calls = []

    def forward(self, q, k, v, layer_id, batch, qk):
        self.calls.append((layer_id, q.clone(), k.clone(), v.clone(), qk))
        q, k = qk(batch.positions, q, k)
        o = torch.nn.functional.scaled_dot_product_attention(
            q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), is_causal=True, enable_gqa=True
        )
        return o.transpose(0, 1)


@pytest.mark.parametrize("path", TINY_MODELS, ids=_ids(TINY_MODELS))
def test_attention_hands_the_backend_unrotated_q_k_v_and_its_qk_step(path):
    """Chapter 3: the attention layer projects, splits and hands q, k, v (not yet normed or rotated)
    with its qk-norm and RoPE to `attn_backend.forward`, the only backend method a model calls; a
    backend that applies that step and attends gives transformers' logits."""
    from minisgl.core import Context

    model = _ours(path)
    backend = _WholeSequenceBackend()
    ctx = Context(page_size=1, attn_backend=backend)
    ids = [5, 17, 42, 8, 99, 3]
    batch = Batch(reqs=[make_req(ids, row=0)], phase="prefill", input_ids=torch.tensor(ids), positions=torch.arange(len(ids)),
                  last_indices=torch.tensor([len(ids) - 1]))
    set_global_ctx(ctx)
    try:
        with torch.inference_mode(), ctx.forward_batch(batch):
            logits = model.forward()[0]
    finally:
        set_global_ctx(None)
    with torch.inference_mode():
        ref = hf_model(path)(torch.tensor([ids])).logits[0, -1]
    torch.testing.assert_close(logits, ref, rtol=1e-4, atol=1e-4)

    assert [c[0] for c in backend.calls] == list(range(model.config.num_layers))
    layer = model.model.layers[0]
    attn, p, d = layer.self_attn, layer.self_attn.qkv_proj, layer.self_attn.qkv_proj.head_dim
    with torch.inference_mode():
        x = layer.input_layernorm(model.model.embed_tokens(torch.tensor(ids)))
        q, k, v = p(x).split([p.num_q_heads * d, p.num_kv_heads * d, p.num_kv_heads * d], dim=-1)
    _, got_q, got_k, got_v, qk = backend.calls[0]
    torch.testing.assert_close(got_q, q.view(len(ids), -1, d))  # as the projection left them
    torch.testing.assert_close(got_k, k.view(len(ids), -1, d))
    torch.testing.assert_close(got_v, v.view(len(ids), -1, d))
    if model.qk_norm:
        assert qk.q_norm is attn.q_norm and qk.k_norm is attn.k_norm
    else:
        assert qk.q_norm is None and qk.k_norm is None
