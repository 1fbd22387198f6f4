"""Chapter 13: structured output and log-probabilities, two mixins over chapter 7's scheduler.

The oracles: the JSON Schema validator for constrained output, transformers' logits for the
log-probabilities, and the staged package for what a scheduler without them does (it refuses,
rather than running a request with its wish dropped).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from file_module import load_file
from helpers import SMOLLM2, TINY_LLAMA, build_llm, eos_ids, hf_greedy, hf_logits, needs_real_smollm2
from minisgl.core import InvalidRequestError
from minisgl.core import SamplingParams as SP

stages = load_file(Path(__file__).resolve().parent.parent / "tools" / "stages.py", "_stages_ch13")

PROMPTS = [[1, 450, 4996, 17354, 1701, 29916], [1, 306, 763, 278, 29871, 29906, 29900, 29896], [1, 12148, 263], [5, 6, 7, 8, 9, 10, 11]]


@pytest.fixture(scope="module")
def llm():
    return build_llm(TINY_LLAMA, max_running_reqs=8)


_ASK = r"""
import sys; sys.path.insert(0, sys.argv[1])
sys.meta_path[:] = [f for f in sys.meta_path if "__editable__" not in getattr(f, "__module__", "")]
from minisgl.core import InvalidRequestError, SamplingParams
from minisgl.llm import LLM
llm = LLM("models/tiny-llama", max_seq_len=64, num_pages=64, prefix_cache="naive")
for kw in ({"logprobs": 2}, {"json_mode": "object"}):
    try:
        out = llm.generate([[1, 2, 3]], SamplingParams(max_tokens=2, **kw))[0]
        print("served", len(out.logprobs))
    except InvalidRequestError as e:
        print("refused", e)
    except TypeError as e:  # before chapter 13 a request cannot even ask
        print("no such field", next(k for k in kw if k in str(e)))
"""


@pytest.mark.parametrize("chapter", [12, 13])
def test_a_scheduler_without_the_mixins_refuses_what_it_cannot_honour(chapter):
    proc = stages.run_python(_ASK, [str(stages.build(chapter))], timeout=300)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()[-2:]
    if chapter == 12:
        assert lines == ["no such field logprobs", "no such field json_mode"]
    else:
        assert lines == ["served 2", "served 0"]


@pytest.mark.parametrize("kw, refused", [
    ({"logprobs": 2}, "this engine cannot honour logprobs: leave it unset"),
    ({"json_mode": "object"}, "this engine cannot honour json_mode: leave it unset"),
    ({"json_mode": "schema", "json_schema": '{"type": "object"}'},
     "this engine cannot honour json_mode, json_schema: leave them unset"),
])
def test_chapter_7s_scheduler_refuses_the_fields_of_chapter_13_that_the_composed_one_serves(llm, kw, refused):
    """One `SamplingParams` class: chapter 7's `Scheduler` alone names none of these fields, yet
    refuses every one that no mixin of it serves, while the composed scheduler (`LLM`) runs them."""
    from minisgl.scheduler import Scheduler

    plain = Scheduler(llm.config)
    with pytest.raises(InvalidRequestError) as e:
        plain.add_request(PROMPTS[0], SP(max_tokens=2, **kw))
    assert str(e.value) == refused
    assert plain.is_idle and not plain.live
    out = llm.generate([PROMPTS[0]], SP(max_tokens=2, **kw))[0]
    assert len(out.token_ids) >= 1 and len(out.logprobs) == (len(out.token_ids) if "logprobs" in kw else 0)
    assert SP(max_tokens=2).logprobs == -1 and SP(max_tokens=2).json_mode == "off"  # defaults: nothing asked


def test_logprobs_are_the_models_log_softmax(llm):
    params = [SP(max_tokens=6, logprobs=5), SP(max_tokens=6, temperature=1.0, seed=3, logprobs=0), SP(max_tokens=6), SP(max_tokens=6, logprobs=20, repetition_penalty=1.5)]
    outs = llm.generate(PROMPTS, params)
    for prompt, sp, out in zip(PROMPTS, params, outs):
        if sp.logprobs < 0:
            assert out.logprobs == [] and out.top_logprobs == []
            continue
        assert len(out.logprobs) == len(out.top_logprobs) == len(out.token_ids)
        ref = torch.log_softmax(hf_logits(TINY_LLAMA, prompt + out.token_ids).float(), -1)[len(prompt) - 1 : -1]
        for i, token in enumerate(out.token_ids):
            assert out.logprobs[i] == pytest.approx(float(ref[i, token]), abs=1e-4)
            top = ref[i].topk(sp.logprobs)
            assert [t for t, _ in out.top_logprobs[i]] == top.indices.tolist()
            assert [v for _, v in out.top_logprobs[i]] == pytest.approx(top.values.tolist(), abs=1e-4)



# ---- JSON-constrained decoding (xgrammar) ----------------------------------------------------------

SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}, "colour": {"enum": ["red", "green", "blue"]},
                                           "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 2}},
          "required": ["ok", "colour", "tags"]}


def test_json_schema_output_parses_and_matches_the_schema():
    """A random model, so the grammar alone makes the output valid; sampled and greedy rows,
    with overlap scheduling (the bitmask waits for the previous token) and without."""
    jsonschema = pytest.importorskip("jsonschema")
    params = [SP(max_tokens=48, json_mode="schema", json_schema=json.dumps(SCHEMA), temperature=t, seed=s) for t, s in ((0.0, None), (1.0, 1), (1.0, 2))]
    params.append(SP(max_tokens=8))  # a plain row in the same batches
    runs = []
    for overlap in (False, True):
        llm = build_llm(TINY_LLAMA, max_running_reqs=8, overlap=overlap)
        outs = llm.generate(PROMPTS, params)
        llm.assert_all_free()
        assert not llm.grammar.active, "a finished request kept its grammar"
        for out in outs[:3]:
            assert out.finish_reason == "stop", out.text
            assert out.token_ids[-1] in eos_ids(TINY_LLAMA)
            jsonschema.validate(json.loads(out.text), SCHEMA)
        assert outs[3].token_ids == hf_greedy(TINY_LLAMA, PROMPTS[3], 8)
        runs.append([o.token_ids for o in outs])
    assert runs[0] == runs[1], "overlap scheduling changed the constrained output"


@needs_real_smollm2  # random weights rarely close an object within 24 tokens
def test_json_object_mode_gives_an_object():
    llm = build_llm(SMOLLM2, max_running_reqs=2)
    out = llm.generate(["Reply in JSON: an object with the key 'capital' giving the capital of France."],
                       SP(max_tokens=24, json_mode="object"), chat=True)[0]
    assert out.finish_reason == "stop", out.text
    assert isinstance(json.loads(out.text), dict)
    llm.assert_all_free()


def test_a_schema_xgrammar_cannot_use_is_refused_before_queueing(llm):
    with pytest.raises(InvalidRequestError, match="json_schema"):
        llm.add_request(PROMPTS[0], SP(json_mode="schema", json_schema='{"type": "no-such-type"}'))
    assert llm.is_idle and not llm.grammar.active
    llm.assert_all_free()


def test_generate_checks_every_schema_before_running_any(llm):
    good = SP(max_tokens=4, json_mode="object")
    bad = SP(json_mode="schema", json_schema='{"type": "no-such-type"}')
    with pytest.raises(InvalidRequestError, match="json_schema"):
        llm.generate([PROMPTS[0], PROMPTS[1]], [good, bad])
    assert llm.is_idle and not llm.grammar.active
    llm.assert_all_free()


def test_aborting_a_waiting_json_request_drops_its_grammar(llm):
    uid = llm.add_request(PROMPTS[0], SP(json_mode="object"))
    llm.abort_request(uid)
    assert llm.take_output(uid).finish_reason == "abort" and not llm.grammar.active


