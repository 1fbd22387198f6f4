"""`LLM`: the offline interface. It is the scheduler, with requests coming from a Python list
instead of a socket and results collected in memory; the main loop is reused unchanged."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Union

import torch

from minisgl.core import InvalidRequestError, Req, SamplingParams
from minisgl.scheduler import SchedulerConfig, scheduler_bases
from minisgl.utils.misc import build_config
from minisgl.utils.tokenizer import NO_CHAT_TEMPLATE, has_chat_template, has_tokenizer, load_tokenizer

Prompt = Union[str, Sequence[int]]
TOKEN_DETAIL = "token_detail"  # a `RequestOutput` field's metadata key: the `token_details` name it collects


def per_token(detail: str) -> Any:
    """A `RequestOutput` field that a later module adds (`extends_in_place`): one entry per token, what
    the scheduler's `token_details` reported about it under the name `detail`."""
    return field(default_factory=list, metadata={TOKEN_DETAIL: detail})


@dataclass
class RequestOutput:
    uid: int
    prompt_ids: List[int]
    token_ids: List[int] = field(default_factory=list)
    text: str = ""
    finish_reason: Optional[str] = None
    cached_tokens: int = 0  # prompt tokens reused from the prefix cache


class LLM(*scheduler_bases()):
    """Generate text offline.

    >>> llm = LLM()                                     # the bundled model
    >>> llm.generate(["The capital of France is"], SamplingParams(max_tokens=8))[0].text
    """

    def __init__(self, model_path: Optional[str | Path] = None, *, config: Optional[SchedulerConfig] = None,
                 **options: Any):
        """`options` are `EngineConfig` and `SchedulerConfig` fields by name (`page_size=4`,
        `max_extend_tokens=512`, `dtype=torch.bfloat16`; upstream spellings such as
        `max_running_req` too); they override `config` when one is given. An unknown name raises
        `UnknownOptionError` (a TypeError) that lists the close matches."""
        if model_path is not None:
            options["model_path"] = str(model_path)
        if config is None:
            options.setdefault("offline", True)  # the prefill budget that suits a whole run (config.py)
        config = build_config(SchedulerConfig, options, base=config)
        super().__init__(config)
        # a config-only folder (random weights for speed tests) has no tokenizer: token ids only
        path = config.engine.model_path
        self.tokenizer = load_tokenizer(path) if has_tokenizer(path) else None
        self._outputs: Dict[int, RequestOutput] = {}

    def encode(self, prompt: Prompt, chat: bool = False) -> List[int]:
        if not isinstance(prompt, str):
            return [int(t) for t in prompt]
        if self.tokenizer is None:
            raise InvalidRequestError(f"{self.config.engine.model_path} has no tokenizer: pass prompts as lists of "
                                      "token ids")
        if chat:
            if not has_chat_template(self.tokenizer):
                raise InvalidRequestError(NO_CHAT_TEMPLATE)
            messages = [{"role": "user", "content": prompt}]
            return list(self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                                           return_dict=False))
        return self.tokenizer.encode(prompt, add_special_tokens=False) or self.tokenizer.encode(prompt)

    def generate(
        self,
        prompts: Sequence[Prompt],
        sampling_params: SamplingParams | Sequence[SamplingParams] = SamplingParams(),
        *,
        chat: bool = False,
    ) -> List[RequestOutput]:
        """Run every prompt to completion. Strings are tokenized (with the chat template when
        `chat=True`); lists of ints are used as token ids. Every request is validated before any
        runs, so one bad prompt raises without leaving the others half done."""
        if isinstance(prompts, str):
            raise TypeError("generate() takes a list of prompts; wrap a single prompt in a list")
        params = [sampling_params] * len(prompts) if isinstance(sampling_params,
                                                                SamplingParams) else list(sampling_params)
        if len(params) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(params)} sampling params")
        encoded = [self.encode(p, chat) for p in prompts]
        for ids, sp in zip(encoded, params):
            self.validate(ids, sp)
        uids = [self.add_request(ids, sp) for ids, sp in zip(encoded, params)]
        while not self.is_idle:
            self.step()
        results = [self.take_output(uid) for uid in uids]
        for out in results:
            tok = self.tokenizer
            out.text = tok.decode(out.token_ids, skip_special_tokens=True) if tok is not None else ""
        return results

    def add_request(self, input_ids: Sequence[int] | torch.Tensor, params: SamplingParams,
                    uid: Optional[int] = None) -> int:
        """Queue a request and open its output record (so requests added by hand, then driven
        with `step()`, are collected like those of `generate`); read it with `take_output`."""
        uid = super().add_request(input_ids, params, uid)
        self._outputs[uid] = RequestOutput(uid, [int(t) for t in input_ids])
        return uid

    def take_output(self, uid: int) -> RequestOutput:
        """Remove and return the output record of request `uid` (finished or not)."""
        return self._outputs.pop(uid)

    def on_token(self, req: Req, token: Optional[int], finish_reason: Optional[str]) -> None:
        out = self._outputs[req.uid]
        if token is not None:
            if not out.token_ids:
                out.cached_tokens = req.reused_len
            out.token_ids.append(token)
            details = self.token_details(req)
            for f in fields(out):  # a field declared with `per_token` collects the detail it names
                name = f.metadata.get(TOKEN_DETAIL)
                if name is not None and name in details:
                    getattr(out, f.name).append(details[name])
        out.finish_reason = finish_reason

    def on_finish_unstarted(self, uid: int, reason: str) -> None:
        self._outputs[uid].finish_reason = reason
