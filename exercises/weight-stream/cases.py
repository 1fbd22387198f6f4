"""Cases for weight-stream: where every checkpoint tensor goes, for several models and TP ranks;
models loaded through it generate (and, for SmolLM2, give the same logits)."""

import hashlib
import random

import torch

from judge import harness
from minisgl.distributed.info import TPInfo, set_tp_info
from judge.api import E2E, Obs, case, snapshot
from minisgl.core import SamplingParams


def _digest(t: torch.Tensor) -> str:
    return hashlib.sha1(t.detach().contiguous().cpu().float().numpy().tobytes()).hexdigest()[:12]


def _placements(obs: Obs, model_name: str, rank: int, size: int, names=None) -> None:
    from minisgl.models import ModelConfig, create_model
    from minisgl.models import weight

    set_tp_info(TPInfo(rank, size))
    try:
        cfg = ModelConfig.from_dir(harness.model_path(model_name))
        model = create_model(cfg, torch.float32, torch.device("cpu"))
        params = model.state_dict()
        obs.eq("model and tensor-parallel rank", [model_name, rank, size])
        for name, tensor in weight.iter_checkpoint(harness.model_path(model_name)):
            if names is not None and name not in names:
                continue
            if (name == "lm_head.weight" and cfg.tie_word_embeddings) or "rotary_emb" in name:
                continue
            before = snapshot(tensor)
            target, rows, piece = weight._place(model, params, name, tensor, TPInfo(rank, size))
            obs.unchanged(f"{name}: the checkpoint tensor you were given", before, tensor)
            where = None if rows is None else [rows.start, rows.stop]
            obs.eq(f"{name}: (parameter, rows, piece shape, piece contents digest)", [target, where, list(piece.shape), _digest(piece)])
    finally:
        set_tp_info(TPInfo(0, 1))


@case("tiny-llama, one rank", hint=1)
def llama_tp1(obs: Obs) -> None:
    _placements(obs, "tiny-llama", 0, 1)


@case("tiny-qwen2 (q/k/v biases, tied embeddings), one rank", hint=2)
def qwen2_tp1(obs: Obs) -> None:
    _placements(obs, "tiny-qwen2", 0, 1)


@case("tiny-llama, rank 1 of 2", hint=3)
def llama_tp2(obs: Obs) -> None:
    _placements(obs, "tiny-llama", 1, 2)


@case("tiny-qwen3, rank 3 of 4 (more ranks than KV heads)", hint=4)
def qwen3_tp4(obs: Obs) -> None:
    _placements(obs, "tiny-qwen3", 3, 4)


@case("random models and ranks", seeds=3, hint=4)
def random_ranks(obs: Obs, seed: int) -> None:
    rng = random.Random(seed)
    size = rng.choice([1, 2, 4])
    _placements(obs, rng.choice(["tiny-llama", "tiny-qwen2", "tiny-qwen3"]), rng.randrange(size), size)


@case("tiny-qwen2 loads and generates; SmolLM2-135M gives the reference's logits", kind=E2E, hint=2)
def engine(obs: Obs) -> None:
    prompts = harness.random_prompts(seed=6, n=3, lo=3, hi=10)
    harness.generate(obs, harness.scheduler_config("tiny-qwen2"), prompts, SamplingParams(max_tokens=5, ignore_eos=True), trace=False)
    cfg = harness.scheduler_config("smollm2-135m-instruct", num_pages=64, max_running_reqs=2, max_seq_len=64)
    rows = harness.teacher_forced_logits(cfg, [504, 3575, 282, 4649, 314], [7042, 30])  # "The capital of France is" + " Paris."
    for step, logits in enumerate(rows):
        obs.close(f"SmolLM2 logits after step {step} (256 fixed vocabulary columns)", logits)
