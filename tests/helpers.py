"""Shared oracles and builders for the chapter tests.

The oracle for every generation test is Hugging Face transformers run in float32 on the CPU
with plain greedy decoding (argmax of the next-token logits, its own KV cache). References are
computed once per process and memoised, so many engine configurations can be checked against
the same tokens cheaply.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import os
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import pytest
import torch

from tools.workbook_env import WORKBOOK

REPO_ROOT = Path(__file__).resolve().parent.parent
MODELS = REPO_ROOT / "models"
SMOLLM2 = MODELS / "smollm2-135m-instruct"
TINY_QWEN3 = MODELS / "tiny-qwen3"
TINY_QWEN2 = MODELS / "tiny-qwen2"
TINY_LLAMA = MODELS / "tiny-llama"


def smollm2_is_random() -> bool:
    """True where models/smollm2-135m-instruct was built with random weights of its shape
    (`tools/prepare_models.py --random-weights`, for a machine that cannot install the real one)."""
    from file_module import load_file

    prepare = load_file(REPO_ROOT / "tools" / "prepare_models.py", "_prepare_models_marker")
    return bool((prepare.read_marker(SMOLLM2) or {}).get("random_weights"))


# for claims about what the real SmolLM2 says (that it answers a chat and stops), not about the engine
needs_real_smollm2 = pytest.mark.skipif(smollm2_is_random(), reason="checks the real SmolLM2's text; this machine's copy has random weights")

# Prompts of very different lengths: 1-3 tokens, a dozen, and well over 20 (the longest spans
# several 7-token chunks). Two pairs share long prefixes so that later arrivals hit the radix cache.
SHARED_PREFIX = (
    "Here is a short story about a lighthouse keeper who lived alone on a rocky island far "
    "from the coast, and every night"
)
PROMPT_TEXTS: List[str] = [
    "Hi",
    "The capital of France is",
    SHARED_PREFIX + " he climbed the stairs to light the lamp.",
    "1, 2, 3,",
    SHARED_PREFIX + " the sea was calm and the stars were bright.",
    "Once upon a time",
    "List three colours of the rainbow: red, orange, and then the next one is",
    "def fibonacci(n):",
]
MAX_TOKENS: List[int] = [1, 3, 8, 16, 5, 16, 3, 8]


@functools.lru_cache(maxsize=None)
def tokenizer(path: Path = SMOLLM2):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path))


def encode(text: str, path: Path = SMOLLM2) -> List[int]:
    return tokenizer(path).encode(text, add_special_tokens=False)


def prompt_ids(path: Path = SMOLLM2) -> List[List[int]]:
    return [encode(t, path) for t in PROMPT_TEXTS]


@functools.lru_cache(maxsize=None)
def hf_model(path: Path):
    """The transformers model for `path`, float32, on the CPU, in eval mode."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32, attn_implementation="sdpa")
    return model.eval()


def eos_ids(path: Path) -> Tuple[int, ...]:
    """The stop tokens the engine uses: config.json's plus generation_config.json's."""
    ids: List[int] = []
    for name in ("config.json", "generation_config.json"):
        f = path / name
        if f.exists():
            eos = json.loads(f.read_text()).get("eos_token_id")
            ids += eos if isinstance(eos, list) else ([eos] if eos is not None else [])
    return tuple(dict.fromkeys(ids))


@torch.inference_mode()
def hf_greedy(path: Path, ids: Sequence[int], max_tokens: int, stop_at_eos: bool = True) -> List[int]:
    """Greedy continuation by transformers: argmax each step, stop after EOS (kept) or max_tokens."""
    from transformers import DynamicCache

    model = hf_model(path)
    stops = set(eos_ids(path)) if stop_at_eos else set()
    if WORKBOOK.test_oracle == "recompute":
        # no KV cache at all: one full forward per token (for transformers releases whose cache
        # API differs from the one below)
        seq, out = list(ids), []
        for _ in range(max_tokens):
            token = int(model(input_ids=torch.tensor([seq])).logits[0, -1].argmax())
            out.append(token)
            seq.append(token)
            if token in stops:
                break
        return out
    cache = DynamicCache(config=model.config)
    # transformers renamed `past_key_values` to `cache` during 5.x; use whichever this one takes
    cache_kw = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    x = torch.tensor([list(ids)])
    out: List[int] = []
    for _ in range(max_tokens):
        logits = model(input_ids=x, use_cache=True, **{cache_kw: cache}).logits[0, -1]
        token = int(logits.argmax())
        out.append(token)
        if token in stops:
            break
        x = torch.tensor([[token]])
    return out


class ReferenceCache:
    """Memoised HF greedy generations. Greedy decoding is prefix-consistent, so one long run per
    prompt answers every shorter `max_tokens` (cut at the first EOS). With `folder` (the suite's
    REFERENCE_DIR_ENV: one temporary folder per run, shared by the xdist workers) a run computed by
    one worker is read by the others instead of computed again."""

    def __init__(self, folder: Optional[Path] = None) -> None:
        self._runs: Dict[Tuple[str, Tuple[int, ...], bool], List[int]] = {}
        self.folder = folder

    def get(self, path: Path, ids: Sequence[int], max_tokens: int, stop_at_eos: bool = True) -> List[int]:
        key = (str(path), tuple(ids), stop_at_eos)
        run = self._runs.get(key) or self._read(key)
        if run is None or (len(run) < max_tokens and not self._ended(path, run, stop_at_eos)):
            run = hf_greedy(path, ids, max(max_tokens, 16), stop_at_eos)
            self._write(key, run)
        self._runs[key] = run
        return run[:max_tokens]

    def _file(self, key: tuple) -> Optional[Path]:
        if self.folder is None:
            return None
        return self.folder / (hashlib.sha256(repr(key).encode()).hexdigest()[:32] + ".json")

    def _read(self, key: tuple) -> Optional[List[int]]:
        file = self._file(key)
        return json.loads(file.read_text()) if file is not None and file.exists() else None

    def _write(self, key: tuple, run: List[int]) -> None:
        file = self._file(key)
        if file is not None:
            tmp = file.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(run))
            os.replace(tmp, file)  # a reader never sees half a file

    @staticmethod
    def _ended(path: Path, run: List[int], stop_at_eos: bool) -> bool:
        return stop_at_eos and bool(run) and run[-1] in eos_ids(path)


def hf_logits(path: Path, ids: Sequence[int]) -> torch.Tensor:
    """`[len(ids), vocab]` next-token logits of the transformers model, one forward pass."""
    with torch.inference_mode():
        return hf_model(path)(input_ids=torch.tensor([list(ids)])).logits[0]


# The suite runs on the CPU by default; on a GPU machine the same tests run there with
# MINISGL_TEST_DEVICE=cuda (float32: token-exact; MINISGL_TEST_DTYPE=bfloat16: see test_ch06).
TEST_DEVICE, TEST_DTYPE, TEST_ATTENTION = WORKBOOK.test_device, WORKBOOK.test_dtype, WORKBOOK.test_attention


def small_engine_kwargs(**overrides) -> dict:
    """Engine settings that keep tests small: float32, a modest KV pool and context."""
    kwargs = dict(device=TEST_DEVICE, dtype=TEST_DTYPE, attention_backend=TEST_ATTENTION,
                  num_pages=512, max_seq_len=512, max_running_reqs=4)
    kwargs.update(overrides)
    return kwargs


def build_llm(path: Path, *, prefix_cache: str = "radix", overlap: bool = False, max_extend_tokens: int = 8192,
              check_integrity: bool = True, **engine_overrides):
    """An `LLM` built through the full `SchedulerConfig(engine=EngineConfig(...))` route."""
    from minisgl.engine import EngineConfig
    from minisgl.llm import LLM
    from minisgl.scheduler import SchedulerConfig

    engine = EngineConfig(model_path=str(path), **small_engine_kwargs(**engine_overrides))
    config = SchedulerConfig(engine=engine, prefix_cache=prefix_cache, max_extend_tokens=max_extend_tokens,
                             overlap=overlap, check_integrity=check_integrity)
    return LLM(config=config)


def greedy_params(max_tokens: int, **kw):
    from minisgl.core import SamplingParams

    return SamplingParams(max_tokens=max_tokens, **kw)


def generate_ids(llm, prompts: Sequence[Sequence[int]], max_tokens: Sequence[int] | int, **kw) -> List[List[int]]:
    """Generate greedily for token-id prompts; check nothing is left allocated; return token ids."""
    if isinstance(max_tokens, int):
        max_tokens = [max_tokens] * len(prompts)
    outs = llm.generate([list(p) for p in prompts], [greedy_params(n, **kw) for n in max_tokens])
    llm.assert_all_free()
    return [o.token_ids for o in outs]


def first_diff(a: Sequence[int], b: Sequence[int]) -> Optional[int]:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


# ---- driving an Engine by hand (what the scheduler does, minus admission) ------------------------


def make_req(ids: Sequence[int], row: int, cached_len: int = 0, max_tokens: int = 8, uid: int = 0, **sp):
    """A request whose first `cached_len` tokens are taken as already in the KV pool."""
    from minisgl.core import Req, SamplingParams
    from minisgl.kvcache.base import BaseCacheHandle

    ids_t = torch.tensor(list(ids), dtype=torch.int32)
    return Req(ids_t, row, cached_len, uid, SamplingParams(max_tokens=max_tokens, **sp), BaseCacheHandle(cached_len))


def map_rows(page_table: torch.Tensor, page_size: int, reqs, lengths: Sequence[int], num_pages: int, seed: int = 0) -> None:
    """Give each request's row `lengths[i]` positions on distinct, shuffled pages among pages
    1..num_pages-1 (so KV is scattered the way the cache manager scatters it)."""
    gen = torch.Generator().manual_seed(seed)
    pages_needed = [-(-n // page_size) for n in lengths]
    assert sum(pages_needed) < num_pages, "not enough pages for these requests"
    pages = torch.randperm(num_pages - 1, generator=gen)[: sum(pages_needed)] + 1
    at = 0
    for req, n, k in zip(reqs, lengths, pages_needed):
        mine = pages[at : at + k]
        at += k
        slots = (mine[:, None] * page_size + torch.arange(page_size)).flatten()[:n]
        page_table[req.table_idx, :n] = slots.to(torch.int32)


def fill_batch(batch, page_table: torch.Tensor) -> None:
    """Flat tensors of a batch from the requests' host tokens and the page table."""
    reqs = batch.reqs
    pos = torch.cat([torch.arange(r.cached_len, r.device_len) for r in reqs])
    rows = torch.cat([torch.full((r.extend_len,), r.table_idx) for r in reqs])
    lens = torch.tensor([r.extend_len for r in reqs])
    dev = page_table.device
    pos, rows = pos.to(dev), rows.to(dev)
    batch.input_ids = torch.cat([r.input_ids[r.cached_len : r.device_len] for r in reqs]).to(dev, torch.int32)
    batch.positions = pos
    batch.out_loc = page_table[rows, pos].long()
    batch.last_indices = (torch.cumsum(lens, 0) - 1).to(dev)


def engine_logits(engine, reqs, phase: str) -> torch.Tensor:
    """Run one forward pass of `engine` on `reqs` and return `[bs, vocab]` logits (the ledgers move on)."""
    from minisgl.core import Batch, set_global_ctx

    batch = Batch(reqs=list(reqs), phase=phase)  # type: ignore[arg-type]
    fill_batch(batch, engine.page_table)
    set_global_ctx(engine.ctx)
    engine.attn_backend.prepare_metadata(batch)
    with engine.ctx.forward_batch(batch):
        logits = engine.model.forward()
    for r in reqs:
        r.complete_one()
    return logits.float().cpu()


def build_engine(path: Path, **overrides):
    from minisgl.engine import Engine, EngineConfig

    return Engine(EngineConfig(model_path=str(path), **small_engine_kwargs(**overrides)))


def load_rank(path: Path, rank: int, size: int):
    """The model as tensor-parallel rank `rank` of `size` loads it, in this process (loading needs
    no collectives), float32 on the CPU; and the checkpoint's tensors by name, to compare with."""
    from minisgl.distributed import TPInfo, set_tp_info
    from minisgl.models import ModelConfig, create_model
    from minisgl.models.weight import iter_checkpoint, load_checkpoint

    set_tp_info(TPInfo(rank, size))
    try:
        model = create_model(ModelConfig.from_dir(path), torch.float32, torch.device("cpu"))
        load_checkpoint(model, path)
    finally:
        set_tp_info(TPInfo())
    return model, dict(iter_checkpoint(path))
