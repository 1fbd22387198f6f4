"""Cases for decode-floor: the decode phase's bytes for small, edge-case, random and published
workloads, and against the decode steps a real engine runs."""

import random

from judge import harness
from judge.api import E2E, Obs, case, snapshot
from minisgl.benchmark import offline  # offline.decode_bytes is read at each call: the judge installs yours there
from minisgl.benchmark.offline import Workload, make_workload


def _count(obs: Obs, label: str, workload: Workload, weight_bytes: int, kv_bytes_per_token: int) -> int:
    before = snapshot((workload.prompts, workload.max_tokens))
    got = offline.decode_bytes(workload, weight_bytes, kv_bytes_per_token)
    obs.unchanged(f"{label}: the workload", before, (workload.prompts, workload.max_tokens))
    obs.eq(f"{label}: type of what decode_bytes returns", type(got).__name__)
    obs.eq(f"{label}: decode_bytes(workload, {weight_bytes}, {kv_bytes_per_token})", int(got))
    return int(got)


def _workload(prompt_lens, max_tokens) -> Workload:
    return Workload([[7] * n for n in prompt_lens], list(max_tokens))


@case("one request: a 5-token prompt, 3 tokens to produce", hint=1)
def one(obs: Obs) -> None:
    _count(obs, "prompt 5, max_tokens 3", _workload([5], [3]), 1000, 10)


@case("max_tokens 1: the prefill gives the only token, no decode step", hint=2)
def no_decode(obs: Obs) -> None:
    _count(obs, "prompt 7, max_tokens 1", _workload([7], [1]), 1000, 10)
    _count(obs, "prompts 7 and 4, max_tokens 1 and 4", _workload([7, 4], [1, 4]), 1000, 10)


@case("requests that stop at different steps", hint=1)
def staggered(obs: Obs) -> None:
    _count(obs, "prompts 5, 9, 2; max_tokens 3, 1, 6", _workload([5, 9, 2], [3, 1, 6]), 1000, 7)


@case("the weights are read once a step, not once a request", hint=2)
def shared_weights(obs: Obs) -> None:
    _count(obs, "four requests, prompt 3, max_tokens 5", _workload([3] * 4, [5] * 4), 100_000, 1)


@case("the nano-vllm workload, Qwen3-0.6B shape in bfloat16", hint=3)
def published(obs: Obs) -> None:
    import torch

    from minisgl.models import ModelConfig, create_model

    cfg = ModelConfig.from_dir(harness.model_path("qwen3-0.6b-dummy"))
    shapes = create_model(cfg, torch.bfloat16, torch.device("meta"))  # shapes only, no memory
    weight_bytes = sum(p.numel() * p.element_size() for p in shapes.state_dict().values())
    kv_per_token = 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * 2
    _count(obs, "256 requests", make_workload(), weight_bytes, kv_per_token)


@case("random workloads", seeds=3, hint=1)
def random_workloads(obs: Obs, seed: int) -> None:
    rng = random.Random(seed)
    for i in range(5):
        n = rng.randint(1, 12)
        w = _workload([rng.randint(1, 300) for _ in range(n)], [rng.randint(1, 60) for _ in range(n)])
        obs.eq(f"workload {i}: prompt lengths and max_tokens", [[len(p) for p in w.prompts], w.max_tokens])
        _count(obs, f"workload {i}", w, rng.randint(1, 10**9), rng.randint(1, 10**5))


@case("tiny-qwen3: your count against the decode steps the engine runs", kind=E2E, hint=1, timeout_s=120)
def engine_trace(obs: Obs) -> None:
    from minisgl.core import SamplingParams
    from minisgl.llm import LLM

    work = make_workload(8, 8, 48, 4, 12)  # the offline benchmark's --quick workload
    llm = LLM(config=harness.scheduler_config("tiny-qwen3", max_running_reqs=8, max_seq_len=128))
    llm.generate(work.prompts, [SamplingParams(max_tokens=m, ignore_eos=True) for m in work.max_tokens])
    eng = llm.engine
    weight_bytes = sum(t.numel() * t.element_size() for t in eng.model.state_dict().values())
    kv = eng.kv_cache
    kv_per_token = kv.bytes_per_page(kv.num_layers, 1, kv.num_kv_heads, kv.head_dim, eng.dtype)
    phases = [t.phase for t in llm.trace]
    obs.eq("the engine's steps: prefill, then decode", [phases.count("prefill"), phases.count("decode")])
    ran = sum(weight_bytes + t.kv_tokens * kv_per_token for t in llm.trace if t.phase == "decode")
    got = _count(obs, "the quick workload", work, weight_bytes, kv_per_token)
    obs.eq("your count equals the bytes summed over the engine's decode steps", got == ran)
