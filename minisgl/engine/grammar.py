"""JSON-constrained decoding with xgrammar: a grammar per request, a token bitmask per step.

xgrammar compiles a JSON schema (or "any JSON object") against the tokenizer's vocabulary once,
then a `GrammarMatcher` per request tracks where in the grammar the output is and answers, for
the next position, which token ids may follow: a bitmask of `ceil(vocab / 32)` int32 words per
row. The sampler sets every other token's logit to -inf (`processors.apply_token_bitmask`), so
the output is valid JSON by construction; once the JSON is complete only end-of-sequence tokens
are allowed, and the request stops.

Matchers advance on the host tokens of their request (`Req.output_ids`), caught up lazily when
the next bitmask is filled, so nothing else in the loop needs to tell them about tokens. The
bitmask for position N+1 needs token N on the host: with overlap scheduling, the scheduler
processes the previous results first while grammar requests run.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional

import torch

from minisgl.core import InvalidRequestError, Req, SamplingParams

# "a JSON object" (json_mode="object"): any keys and values, but an object, as OpenAI's json_object
ANY_OBJECT = json.dumps({"type": "object"})


@dataclass
class _Tracked:
    matcher: Any  # xgrammar.GrammarMatcher
    accepted: int = 0  # output tokens fed to the matcher so far


class GrammarManager:
    """The grammars of the live JSON requests, by uid. Built lazily: the tokenizer and xgrammar
    load on the first JSON request only."""

    def __init__(self, model_path: str | Path, vocab_size: int, eos_ids: Iterable[int]):
        self.model_path = Path(model_path)
        self.vocab_size = vocab_size
        self.eos_ids = sorted(set(eos_ids))
        self.tracked: Dict[int, _Tracked] = {}
        self._compiler: Any = None
        self._batch_matcher: Any = None

    @property
    def active(self) -> bool:
        return bool(self.tracked)

    def _get_compiler(self) -> Any:
        if self._compiler is None:
            import xgrammar as xgr
            from transformers import AutoTokenizer

            if not any((self.model_path / f).exists() for f in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")):
                raise InvalidRequestError(f"{self.model_path} has no tokenizer, which JSON mode needs; turn json_mode off")
            tokenizer = AutoTokenizer.from_pretrained(str(self.model_path))
            # the model's vocabulary may be padded past the tokenizer's; those ids are never allowed
            info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=self.vocab_size, stop_token_ids=self.eos_ids)
            self._compiler = xgr.GrammarCompiler(info, cache_enabled=True)
            self._batch_matcher = xgr.BatchGrammarMatcher()
        return self._compiler

    def compile(self, params: SamplingParams) -> Any:
        """The compiled grammar of a JSON request (cached by schema); InvalidRequestError if the
        schema is one xgrammar cannot use."""
        schema = ANY_OBJECT if params.json_mode == "object" else params.json_schema
        compiler = self._get_compiler()
        try:
            # compact JSON: a small model left free to add whitespace may emit it forever
            return compiler.compile_json_schema(schema, any_whitespace=False, strict_mode=params.json_mode == "schema")
        except (RuntimeError, ValueError, TypeError) as e:
            raise InvalidRequestError(f"json_schema cannot be used to constrain decoding: {e}") from None

    def add(self, uid: int, params: SamplingParams) -> None:
        """Start tracking a JSON request (no-op for others)."""
        if params.json_mode == "off":
            return
        import xgrammar as xgr

        self.tracked[uid] = _Tracked(xgr.GrammarMatcher(self.compile(params)))

    def release(self, uid: int) -> None:
        self.tracked.pop(uid, None)

    def fill(self, reqs: List[Req]) -> Optional[torch.Tensor]:
        """The next token's bitmask for a batch about to be launched: `[bs, words]` int32 on the
        host, all ones for rows without a grammar; None when no row has one."""
        rows = [(i, self.tracked.get(r.uid)) for i, r in enumerate(reqs)]
        rows = [(i, t, reqs[i]) for i, t in rows if t is not None and not reqs[i].finished and not reqs[i].is_chunk]
        if not rows:
            return None
        import xgrammar as xgr

        bitmask = xgr.allocate_token_bitmask(len(reqs), self.vocab_size)  # all ones
        live, where = [], []
        for i, t, req in rows:
            assert len(req.input_ids) == req.device_len, (
                f"req {req.uid}: the grammar needs every sampled token on the host before the next step "
                f"({len(req.input_ids)} of {req.device_len}); process results before launching"
            )
            for token in req.output_ids[t.accepted :].tolist():
                assert t.matcher.accept_token(token), f"req {req.uid}: token {token} broke its grammar"
                t.accepted += 1
            if not t.matcher.is_terminated():
                live.append(t.matcher)
                where.append(i)
        if live:
            self._batch_matcher.batch_fill_next_token_bitmask(live, bitmask, where)
        return bitmask
