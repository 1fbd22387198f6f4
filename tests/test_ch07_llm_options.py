"""Chapter 7, `LLM(path, **options)`: every engine and scheduler setting by name.

Claims: any `EngineConfig` or `SchedulerConfig` field is a keyword of `LLM` (and so are upstream
mini-sglang's spellings), landing in the same config that spelling it out by hand builds, and the
engine so built generates transformers' greedy tokens; `dtype` takes a `torch.dtype`; a keyword
that names no setting raises a typed error that names it and its close matches; keywords
override a `config=` passed beside them; `MINISGL_DISABLE_OVERLAP=1` changes only the default.
"""

from __future__ import annotations

import pytest
import torch

from helpers import TINY_LLAMA, generate_ids, hf_greedy, prompt_ids
from minisgl.engine import EngineConfig
from minisgl.llm import LLM
from minisgl.scheduler import SchedulerConfig
from minisgl.scheduler import config as scheduler_config_module
from minisgl.scheduler import overlap as overlap_module  # declares `overlap`, its default read from OVERLAP_ENV
from minisgl.utils import UnknownOptionError

SMALL = dict(device="cpu", max_seq_len=128, num_pages=128)


def test_engine_and_scheduler_fields_by_name_build_the_same_config_and_transformers_tokens():
    llm = LLM(TINY_LLAMA, dtype=torch.float32, page_size=4, max_running_reqs=2, max_extend_tokens=5,
              schedule_policy="lpm", prefix_cache="radix", overlap=False, check_integrity=True, **SMALL)
    by_hand = SchedulerConfig(engine=EngineConfig(model_path=str(TINY_LLAMA), dtype="float32", page_size=4, max_running_reqs=2, **SMALL),
                              max_extend_tokens=5, schedule_policy="lpm", prefix_cache="radix", overlap=False, check_integrity=True,
                              offline=True)  # what the LLM front end adds: it runs offline
    assert llm.config == by_hand
    prompts = [p for p in prompt_ids(TINY_LLAMA) if len(p) > 5][:3]  # longer than the budget: chunked
    assert generate_ids(llm, prompts, 6) == [hf_greedy(TINY_LLAMA, p, 6) for p in prompts]


def test_upstream_spellings_are_the_same_settings():
    llm = LLM(TINY_LLAMA, max_running_req=3, memory_ratio=0.5, num_page_override=96, max_seq_len_override=100,
              cache_type="naive", use_dummy_weight=True, device="cpu")
    engine = llm.config.engine
    assert (engine.max_running_reqs, engine.memory_fraction, engine.num_pages, engine.max_seq_len, engine.dummy_weights) == (3, 0.5, 96, 100, True)
    assert llm.config.prefix_cache == "naive"
    with pytest.raises(TypeError, match="given twice"):
        LLM(TINY_LLAMA, max_running_reqs=2, max_running_req=2, **SMALL)


@pytest.mark.parametrize("dtype, name", [(torch.float32, "float32"), (torch.bfloat16, "bfloat16")])
def test_dtype_as_a_torch_dtype(dtype, name):
    llm = LLM(TINY_LLAMA, dtype=dtype, **SMALL)
    assert llm.config.engine.dtype == name
    assert next(iter(llm.engine.model.state_dict().values())).dtype == dtype


def test_an_unknown_keyword_names_itself_and_its_close_matches():
    with pytest.raises(UnknownOptionError) as e:
        LLM(TINY_LLAMA, max_extend_token=64, pagesize=4, **SMALL)
    assert isinstance(e.value, TypeError) and e.value.unknown == ["max_extend_token", "pagesize"]
    msg = str(e.value)
    assert msg.startswith("unknown settings 'max_extend_token' (did you mean max_extend_tokens?), 'pagesize' (did you mean page_size")
    assert "page_size" in e.value.valid and "schedule_policy" in e.value.valid and "model_path" in e.value.valid
    with pytest.raises(UnknownOptionError, match="'colour'; valid settings: "):
        LLM(TINY_LLAMA, colour="blue")


def test_keywords_override_a_given_config():
    base = SchedulerConfig(engine=EngineConfig(model_path=str(TINY_LLAMA), **SMALL), prefix_cache="naive", overlap=False)
    llm = LLM(config=base, page_size=4, max_extend_tokens=9)
    assert llm.config.engine.page_size == 4 and llm.config.max_extend_tokens == 9
    assert llm.config.prefix_cache == "naive" and llm.config.engine.num_pages == 128  # the rest is the given config's
    assert LLM(config=base).config == base


def test_the_overlap_switch_sets_the_default_and_a_keyword_wins(monkeypatch):

    assert LLM(TINY_LLAMA, **SMALL).config.overlap is True
    monkeypatch.setattr(overlap_module, "OVERLAP_ENV", overlap_module.OverlapSwitches(disable_overlap=True))
    assert LLM(TINY_LLAMA, **SMALL).config.overlap is False
    assert LLM(TINY_LLAMA, overlap=True, **SMALL).config.overlap is True


def test_the_offline_llm_prefills_in_fuller_steps_than_a_server():
    """Every step reads all the weights: offline, fewer and fuller prefill steps win; a server
    keeps its steps short, because running streams wait for each one."""
    llm = LLM(TINY_LLAMA, **SMALL)
    server = SchedulerConfig(engine=EngineConfig(model_path=str(TINY_LLAMA), **SMALL))
    assert (llm.config.max_extend_tokens, server.max_extend_tokens) == (4096, 256)
    # on a GPU the offline steps are twice a server's: an eager prefill step's launches cost the host about
    # the same at any length, and at 8192 tokens the GPU waited on them
    assert (scheduler_config_module.default_extend_budget("cuda", offline=True), scheduler_config_module.default_extend_budget("cuda")) == (16384, 8192)
    assert LLM(TINY_LLAMA, max_extend_tokens=16, **SMALL).config.max_extend_tokens == 16  # a choice is kept
