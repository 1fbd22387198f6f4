"""Small engine runs for end-to-end cases: a scheduler on a tiny model with token-id prompts, its
tokens, finish reasons and step trace recorded as observations, and teacher-forced logits."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

import torch

from .api import Obs
from .registry import REPO_ROOT

MODELS = REPO_ROOT / "models"


def model_path(name: str = "tiny-llama") -> str:
    path = MODELS / name
    if not path.is_dir():
        raise FileNotFoundError(f"{path} is missing: run `python tools/prepare_models.py`")
    return str(path)


def device() -> torch.device:
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


def random_prompts(seed: int, n: int, lo: int = 3, hi: int = 24, vocab: int = 5000, shared_prefix: int = 0) -> List[List[int]]:
    rng = random.Random(seed)
    prefix = [rng.randrange(10, vocab) for _ in range(shared_prefix)]
    return [prefix + [rng.randrange(10, vocab) for _ in range(rng.randint(lo, hi))] for _ in range(n)]


def scheduler_config(model: str = "tiny-llama", *, page_size: int = 1, num_pages: int = 512, max_running_reqs: int = 8,
                     max_seq_len: int = 256, max_extend_tokens: int = 8192, prefix_cache: str = "radix", overlap: bool = False):
    from minisgl.engine import EngineConfig
    from minisgl.scheduler import SchedulerConfig

    engine = EngineConfig(model_path=model_path(model), page_size=page_size, num_pages=num_pages, max_running_reqs=max_running_reqs,
                          max_seq_len=max_seq_len, use_cuda_graph=False, attention_backend="torch")
    return SchedulerConfig(engine=engine, prefix_cache=prefix_cache, max_extend_tokens=max_extend_tokens, overlap=overlap, check_integrity=True)


@dataclass
class Finished:
    tokens: List[int] = field(default_factory=list)
    finish_reason: Optional[str] = None


def make_scheduler(config, bases: Optional[Tuple[type, ...]] = None):
    """A scheduler keeping every request's tokens and finish reason: the engine's complete one
    (every registered mixin over `Scheduler`), or one of `bases` (chapter 7's: `(Scheduler,)`)."""
    from minisgl.scheduler import scheduler_bases

    class Recording(*(bases or scheduler_bases())):
        def __init__(self, cfg):
            super().__init__(cfg)
            self.outputs: Dict[int, Finished] = {}

        def on_token(self, req, token, finish_reason):
            out = self.outputs.setdefault(req.uid, Finished())
            if token is not None:
                out.tokens.append(int(token))
            out.finish_reason = finish_reason

        def on_finish_unstarted(self, uid, reason):
            self.outputs.setdefault(uid, Finished()).finish_reason = reason

    return Recording(config)


def run_until_idle(sched, max_steps: int = 400) -> int:
    steps = 0
    while not sched.is_idle:
        if steps >= max_steps:
            raise RuntimeError(f"the scheduler is not idle after {max_steps} steps: something never finishes (or is never freed)")
        sched.step()
        steps += 1
    return steps


def generate(obs: Obs, config, prompts: Sequence[Sequence[int]], params, *, trace: bool = True, rounds: int = 1,
             max_steps: int = 400, bases: Optional[Tuple[type, ...]] = None) -> None:
    """Run prompts to completion (`rounds` times on one scheduler, so later rounds can hit the prefix
    cache) and record each request's tokens and finish reason, the step trace and the final state.
    `bases`: the scheduler's classes (default: the engine's complete scheduler)."""
    sched = make_scheduler(config, bases)
    plist = params if isinstance(params, (list, tuple)) else [params] * len(prompts)
    for rnd in range(rounds):
        uids = [sched.add_request(p, sp) for p, sp in zip(prompts, plist)]
        run_until_idle(sched, max_steps)
        for i, uid in enumerate(uids):
            out = sched.outputs.get(uid, Finished())
            tag = f"round {rnd}, request {i}" if rounds > 1 else f"request {i}"
            obs.eq(f"{tag}: generated token ids", out.tokens)
            obs.eq(f"{tag}: finish reason", out.finish_reason)
    if trace:
        record_trace(obs, sched.trace)
    sched.assert_all_free()
    obs.eq("after the run: pages held by the prefix cache", len(sched.cache.kept_pages()))  # none without one


def record_trace(obs: Obs, trace) -> None:
    obs.eq("number of engine steps", len(trace))
    for t in trace:
        obs.eq(f"step {t.step}: phase, request uids, extend lengths, cached lengths", [t.phase, t.uids, t.extend_lens, t.cached_lens])


def teacher_forced_logits(config, prompt: Sequence[int], forced: Sequence[int], vocab_sample: int = 256, seed: int = 0) -> List[torch.Tensor]:
    """Logits at each step when the tokens fed back are `forced` instead of sampled: a prefill of
    `prompt`, then one decode step per forced token. Returns `[steps, vocab_sample]` columns (a
    fixed random subset of the vocabulary plus the argmax of the first step), so runs compare
    step by step even where a tiny numeric difference would flip a sampled token."""
    from minisgl.core import SamplingParams

    sched = make_scheduler(config)
    engine = sched.engine
    sched.add_request(list(prompt), SamplingParams(max_tokens=len(forced) + 1, ignore_eos=True))
    gen = torch.Generator().manual_seed(seed)
    cols = torch.randperm(engine.model_config.vocab_size, generator=gen)[:vocab_sample]
    rows: List[torch.Tensor] = []
    for step in range(len(forced) + 1):
        batch = sched.schedule_next_batch()
        sched.prepare(batch)
        engine.attn_backend.prepare_metadata(batch)
        with engine.ctx.forward_batch(batch):
            logits = engine.model.forward()
        rows.append(logits[: batch.size].float().cpu()[:, cols])  # [bs, vocab] at each request's last position
        for req in batch.reqs:
            req.complete_one()
        if step == len(forced):
            break
        req = batch.reqs[0]
        token = int(forced[step])
        sched.table.token_pool[req.table_idx, req.device_len - 1] = token
        req.append_host(token)
        sched.decode.add([req])
    return rows


# ---- managers without a model: for unit cases on the scheduler's pieces -----------------------------
def managers(rows: int = 4, num_pages: int = 64, page_size: int = 1, max_seq_len: int = 128,
             prefix_cache: Optional[str] = "radix"):
    """A TableManager and a CacheManager with the prefix cache named `prefix_cache` (None: chapter 7's
    PageAllocator, no prefix cache) sharing one page table (with its dummy row), on the device the
    engine would use: the GPU when there is one, as in a real run."""
    from minisgl.scheduler.pages import PageAllocator
    from minisgl.scheduler.table import TableManager

    page_table = torch.zeros((rows + 1, max_seq_len), dtype=torch.int32, device=device())
    table = TableManager(rows, page_table)
    if prefix_cache is None:
        return table, PageAllocator(num_pages, page_size, page_table)
    from minisgl.kvcache import create_prefix_cache
    from minisgl.scheduler.cache import CacheManager

    cache = CacheManager(num_pages, page_size, create_prefix_cache(prefix_cache, page_size, device()), page_table)
    return table, cache


def cache_prefix(cache, ids: Sequence[int]) -> None:
    """Put `ids` (whole pages) into the prefix cache on fresh pages, as a finished request would."""
    ps = cache.page_size
    ids = torch.tensor(list(ids)[: len(ids) // ps * ps], dtype=torch.int32)
    if len(ids) == 0:
        return
    pages = cache._take_pages(len(ids) // ps)
    slots = (pages[:, None] * ps + torch.arange(ps)).flatten().to(cache.page_table.device, torch.int32)
    kept = cache.prefix_cache.insert_prefix(ids, slots)
    cache._release_slots(slots[:kept])  # the part the cache already had


def arrive(pm, step: int, prompts: Sequence[Sequence[int]], arrivals: Sequence[int], max_tokens: int | Sequence[int]) -> None:
    """Queue on PrefillManager `pm` every prompt whose arrival step is `step` (request uid = its
    index in `prompts`), as a client sending requests over time would."""
    for uid, (ids, at) in enumerate(zip(prompts, arrivals)):
        if at == step:
            pm.add(pending(uid, ids, max_tokens if isinstance(max_tokens, int) else max_tokens[uid]))


def pending(uid: int, ids: Sequence[int], max_tokens: int, seed: int = 0):
    from minisgl.core import SamplingParams
    from minisgl.scheduler.prefill import PendingReq

    return PendingReq(uid, torch.tensor(list(ids), dtype=torch.int32), SamplingParams(max_tokens=max_tokens), seed)
