"""Chapter 15: log-probabilities in OpenAI's chat and completions shapes, and 64-bit seeds, over
HTTP. Oracle: transformers' log-softmax over the same tokens. One tiny-llama server, in float32 on
every device (on CUDA the default is bfloat16, whose logprobs differ from a float32 oracle by more
than the tolerance below).
"""

from __future__ import annotations

import math

import pytest
import torch
from transformers import AutoModelForCausalLM

from minisgl.core import SamplingParams
from server_utils import REPO_ROOT, client_fixture, llm_fixture, post, server_fixture

TINY = "models/tiny-llama"
NAME = "tiny-llama"
PROMPT = "The quick brown fox jumps over the lazy dog, and then"


server = server_fixture(TINY, "--dtype", "float32")
llm = llm_fixture(TINY, dtype="float32")
client = client_fixture()


def test_64_bit_seeds_are_kept_whole(server):
    texts = []
    for seed in (5, 5 + 2**31, 5 + 2**63):
        r = post(server, {"model": NAME, "prompt": PROMPT, "max_tokens": 8, "temperature": 1.0, "seed": seed})
        texts.append(r.json()["choices"][0]["text"])
    assert len(set(texts)) == 3, texts


# ---- log-probabilities ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def hf_logprobs():
    model = AutoModelForCausalLM.from_pretrained(REPO_ROOT / TINY, torch_dtype=torch.float32).eval()

    def logprobs(ids):
        with torch.no_grad():
            return torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), -1)

    return logprobs


def test_chat_logprobs_match_transformers(server, client, llm, hf_logprobs):
    messages = [{"role": "user", "content": "Name a color."}]
    resp = client.chat.completions.create(model=NAME, messages=messages, max_tokens=6, temperature=0, logprobs=True, top_logprobs=3)
    content = resp.choices[0].logprobs.content
    prompt = llm.encode(messages[0]["content"], chat=True)
    out = llm.generate([messages[0]["content"]], SamplingParams(max_tokens=6), chat=True)[0]
    assert len(content) == len(out.token_ids) == resp.usage.completion_tokens
    lp = hf_logprobs(prompt + out.token_ids)
    for i, (entry, token) in enumerate(zip(content, out.token_ids)):
        row = lp[len(prompt) - 1 + i]
        assert entry.bytes == list(llm.tokenizer.decode([token]).encode()) or entry.token.startswith("bytes:")
        assert math.isclose(entry.logprob, row[token].item(), abs_tol=2e-3)
        top = torch.topk(row, 3)
        assert [t.logprob for t in entry.top_logprobs] == pytest.approx(top.values.tolist(), abs=2e-3)
        assert entry.top_logprobs[0].token == entry.token  # greedy: the chosen token is the most likely
    streamed = client.chat.completions.create(model=NAME, messages=messages, max_tokens=6, temperature=0, logprobs=True, top_logprobs=3, stream=True)
    pieces = [e for chunk in streamed for c in chunk.choices if c.logprobs for e in c.logprobs.content]
    # the same tokens; the values agree to rounding (the second request reuses the cached prompt, and
    # on a GPU a prefill of other length may sum in another order)
    assert [e.token for e in pieces] == [e.token for e in content]
    assert [e.logprob for e in pieces] == pytest.approx([e.logprob for e in content], abs=1e-4)


def test_completion_logprobs_shape(server, llm):
    got = post(server, {"model": NAME, "prompt": PROMPT, "max_tokens": 5, "temperature": 0, "logprobs": 2}).json()["choices"][0]
    lp = got["logprobs"]
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == len(lp["text_offset"]) == 5
    assert "".join(lp["tokens"]) == got["text"]
    assert lp["text_offset"] == [sum(len(t) for t in lp["tokens"][:i]) for i in range(5)]
    for token, logprob, top in zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"]):
        assert len(top) == 2 and top[token] == logprob and logprob <= 0
