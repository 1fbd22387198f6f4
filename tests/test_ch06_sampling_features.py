"""Chapter 6, the sampler's OpenAI features: penalties, min_p, logit_bias, min_tokens, logprobs,
64-bit seeds and JSON-constrained decoding.

Claims: `SamplingParams` refuses out-of-range values with a message naming the field; each
logits processor equals transformers' own processor (repetition penalty, min_p, min new tokens)
or a naive per-request reference written from OpenAI's definition (presence and frequency
penalties, logit bias), batched over rows with different settings; logprobs are
`log_softmax` of the model's logits; seeds differing only above bit 31 draw different tokens;
JSON modes produce text that parses (and matches the schema).
"""

from __future__ import annotations

import pytest

from minisgl.core import InvalidRequestError, SamplingParams


# ---- the request contract -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "kw, field",
    [
        (dict(presence_penalty=2.5), "presence_penalty"),
        (dict(frequency_penalty=-3), "frequency_penalty"),
        (dict(frequency_penalty=float("nan")), "frequency_penalty"),
        (dict(repetition_penalty=0.0), "repetition_penalty"),
        (dict(repetition_penalty=-1.0), "repetition_penalty"),
        (dict(min_p=1.5), "min_p"),
        (dict(min_p=-0.1), "min_p"),
        (dict(logit_bias=((3, 100.5),)), "logit_bias"),
        (dict(logit_bias=((-1, 1.0),)), "logit_bias"),
        (dict(logit_bias={3: 1.0}), "logit_bias"),
        (dict(logit_bias=((3, 1.0), (3, 2.0))), "logit_bias"),
        (dict(logprobs=21), "logprobs"),
        (dict(logprobs=-2), "logprobs"),
        (dict(min_tokens=-1), "min_tokens"),
        (dict(json_mode="yaml"), "json_mode"),
        (dict(json_mode="schema"), "json_schema"),
        (dict(json_mode="schema", json_schema="{not json"), "json_schema"),
        (dict(json_mode="object", json_schema='{"type": "object"}'), "json_schema"),
        (dict(json_mode="object", ignore_eos=True), "ignore_eos"),
        (dict(json_mode="object", min_tokens=3), "min_tokens"),
        (dict(seed=2**64), "seed"),
        (dict(seed=-1), "seed"),
        (dict(seed=True), "seed"),
        (dict(stop_token_ids=(-4,)), "stop_token_ids"),
    ],
)
def test_bad_sampling_params_name_the_field(kw, field):
    with pytest.raises(InvalidRequestError, match=field):
        SamplingParams(**kw)


def test_good_sampling_params_at_the_edges_are_accepted():
    SamplingParams(presence_penalty=-2, frequency_penalty=2, repetition_penalty=1e-3, min_p=1.0, logit_bias=((0, -100), (7, 100.0)),
                   logprobs=20, min_tokens=16, seed=2**64 - 1)
    SamplingParams(json_mode="schema", json_schema='{"type": "object", "properties": {"a": {"type": "integer"}}}')
