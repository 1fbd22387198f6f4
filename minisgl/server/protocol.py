"""Request bodies of the OpenAI-compatible API, validated by pydantic, and their translation to
`SamplingParams`.

Every field a client may send is declared here, and each is either honoured or refused with a
400 that names it; an undeclared field is refused too (``extra="forbid"``), so a client never gets
other output than it asked for without being told. Types are strict (``"5"`` is not a number) and
integers are bounded, so nothing out of range reaches the engine.
"""

from __future__ import annotations

import hashlib
from typing import Any, Dict, List, Literal, Optional, Tuple, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from minisgl.core import SamplingParams

I32_MAX = 2**31 - 1
MAX_CHOICES = 128  # n times the number of prompts: each choice is a request in the scheduler
MAX_TOP_LOGPROBS = 20  # OpenAI's limit for chat (completions allows 5)


class Unsupported(ValueError):
    """A declared field set to something this server does not do; `param` names the field."""

    def __init__(self, param: str, message: str):
        super().__init__(f"{param}: {message}")
        self.param = param


QUOTE_CHARS = 40  # of a value the client sent, quoted in an error message


def quote(value: Any) -> str:
    """`repr(value)`, cut to `QUOTE_CHARS` characters: an error names what was wrong without
    echoing a megabyte back."""
    text = repr(value)
    return text if len(text) <= QUOTE_CHARS else f"{text[:QUOTE_CHARS]}... ({len(text)} characters)"


def find_lone_surrogate(value: Any, where: str = "body") -> Optional[str]:
    """The path of the first string that is not valid Unicode (JSON allows "\\ud800"; UTF-8 does not)."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return where
    elif isinstance(value, dict):
        for k, v in value.items():
            hit = find_lone_surrogate(k, where) or find_lone_surrogate(v, f"{where}.{k}" if where != "body" else str(k))
            if hit:
                return hit
    elif isinstance(value, list):
        for i, v in enumerate(value):
            hit = find_lone_surrogate(v, f"{where}.{i}")
            if hit:
                return hit
    return None


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class StreamOptions(_Strict):
    include_usage: bool = False


class JsonSchemaFormat(_Strict):
    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True)
    name: str
    description: Optional[str] = None
    schema_: Dict[str, Any] = Field(default_factory=dict, alias="schema")
    strict: Optional[bool] = None  # the schema is always enforced, strict or not


class ResponseFormat(_Strict):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: Optional[JsonSchemaFormat] = None

    @model_validator(mode="after")
    def _schema_given(self) -> "ResponseFormat":
        if (self.type == "json_schema") != (self.json_schema is not None):
            raise ValueError("give json_schema exactly when type is 'json_schema'")
        return self


def choice_seed(seed: int, index: int) -> int:
    """The seed of choice `index` of a request seeded `seed`: choice 0 keeps it (so `n=1` and the
    first of `n` choices agree), the others get distinct 64-bit seeds derived from both."""
    if index == 0:
        return seed
    digest = hashlib.blake2b(f"{seed}:{index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")


class _Common(_Strict):
    """Fields chat and completions share. Beyond OpenAI's: top_k, min_p, repetition_penalty,
    min_tokens, stop_token_ids, ignore_eos (the names vLLM and SGLang use)."""

    model: str
    max_tokens: Optional[int] = Field(None, ge=1, le=I32_MAX)
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(-1, ge=-1, le=I32_MAX)
    min_p: float = Field(0.0, ge=0.0, le=1.0)
    presence_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    repetition_penalty: float = Field(1.0, gt=0.0, le=10.0)
    logit_bias: Optional[Dict[str, float]] = None  # token id (a decimal string) -> bias in [-100, 100]
    stop: Optional[Union[str, List[str]]] = None
    stop_token_ids: Optional[List[int]] = None
    min_tokens: int = Field(0, ge=0, le=I32_MAX)
    seed: Optional[int] = Field(None, ge=0, lt=2**64)
    ignore_eos: bool = False
    n: int = Field(1, ge=1, le=MAX_CHOICES)
    stream: bool = False
    stream_options: Optional[StreamOptions] = None
    user: Optional[str] = None  # the caller's end-user id: it identifies, it never changes the output

    @model_validator(mode="before")
    @classmethod
    def _valid_unicode(cls, data: Any) -> Any:
        where = find_lone_surrogate(data)
        if where is not None:
            raise ValueError(f"{where[:QUOTE_CHARS]} is not valid Unicode (a lone UTF-16 surrogate): send UTF-8 text")
        return data

    @field_validator("top_k")
    @classmethod
    def _top_k(cls, v: int) -> int:
        if v == 0:
            raise ValueError("top_k must be -1 (off) or >= 1")
        return v

    @field_validator("stop")
    @classmethod
    def _stop(cls, v: Optional[Union[str, List[str]]]) -> Optional[List[str]]:
        stops = [v] if isinstance(v, str) else v
        if stops is not None and (len(stops) > 4 or any(not s for s in stops)):
            raise ValueError("stop takes at most 4 non-empty strings")
        return stops

    @field_validator("stop_token_ids")
    @classmethod
    def _stop_ids(cls, v: Optional[List[int]]) -> Optional[List[int]]:
        if v is not None and any(not 0 <= t <= I32_MAX for t in v):
            raise ValueError("stop_token_ids are token ids: integers >= 0")
        return v

    @field_validator("logit_bias")
    @classmethod
    def _logit_bias(cls, v: Optional[Dict[str, float]]) -> Optional[Dict[str, float]]:
        for key, bias in (v or {}).items():
            # isdigit() alone takes other scripts' digits ("١٢"), which int() would read as 12
            if not (key.isascii() and key.isdigit()) or len(key) > 10 or int(key) > I32_MAX:
                raise ValueError(f"keys are token ids written as decimal strings (ASCII digits), got {quote(key)}")
            if not -100.0 <= bias <= 100.0:
                raise ValueError(f"biases are in [-100, 100], got {bias} for token {key}")
        return v

    @model_validator(mode="after")
    def _consistent(self) -> "_Common":
        if self.stream_options is not None and not self.stream:
            raise Unsupported("stream_options", "only allowed when stream is true")
        limit = self.limit()
        if limit is not None and self.min_tokens > limit:
            raise Unsupported("min_tokens", f"{self.min_tokens} is more than the token limit {limit}")
        return self

    # ---- what the engine gets -------------------------------------------------------------
    def stop_list(self) -> List[str]:
        return list(self.stop or [])

    def limit(self) -> Optional[int]:
        return self.max_tokens

    def num_logprobs(self) -> int:
        """-1: no log-probabilities; k >= 0: the chosen token's and the k most likely ones'."""
        return -1

    def json_mode(self) -> Tuple[str, str]:
        return "off", ""

    def sampling_params(self, index: int = 0) -> SamplingParams:
        """The parameters of choice `index` (they differ only in the seed)."""
        mode, schema = self.json_mode()
        return SamplingParams(
            max_tokens=self.limit() or 1,  # placeholder when unset: the tokenizer fills the context's room
            temperature=self.temperature,
            top_k=self.top_k,
            top_p=self.top_p,
            min_p=self.min_p,
            presence_penalty=self.presence_penalty,
            frequency_penalty=self.frequency_penalty,
            repetition_penalty=self.repetition_penalty,
            logit_bias=tuple(sorted((int(k), float(b)) for k, b in (self.logit_bias or {}).items())),
            logprobs=self.num_logprobs(),
            min_tokens=self.min_tokens,
            json_mode=mode,
            json_schema=schema,
            seed=None if self.seed is None else choice_seed(self.seed, index),
            ignore_eos=self.ignore_eos,
            stop_token_ids=tuple(self.stop_token_ids or ()),
        )


# ---- completions -------------------------------------------------------------------------------


class CompletionRequest(_Common):
    prompt: Union[str, List[str], List[int], List[List[int]]]
    max_tokens: Optional[int] = Field(16, ge=1, le=I32_MAX)  # the OpenAI default for completions
    logprobs: Optional[int] = Field(None, ge=0, le=5)
    echo: bool = False
    best_of: Optional[int] = Field(None, ge=1, le=MAX_CHOICES)
    suffix: Optional[str] = None

    @field_validator("prompt", mode="before")
    @classmethod
    def _prompt_shape(cls, v: Any) -> Any:
        """One clear message instead of one per member of the union."""
        def ids(x: Any) -> bool:
            return isinstance(x, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in x)

        texts = isinstance(v, list) and (all(isinstance(x, str) for x in v) or all(ids(x) for x in v))
        if isinstance(v, str) or ids(v) or texts:
            return v
        raise ValueError("must be a text, a list of token ids, a list of texts, or a list of lists of token ids")

    @model_validator(mode="after")
    def _supported(self) -> "CompletionRequest":
        if self.best_of is not None and self.best_of != self.n:
            raise Unsupported("best_of", "only best_of equal to n is supported (no ranking of extra samples)")
        if self.suffix:
            raise Unsupported("suffix", "insertion (text after the completion) is not supported")
        if self.echo and self.logprobs is not None:
            raise Unsupported("echo", "echo with logprobs needs the prompt's log-probabilities, which this server "
                                      "does not compute")
        if len(self.prompts()) * self.n > MAX_CHOICES:
            raise Unsupported("n", f"{len(self.prompts())} prompts times n={self.n} is more than {MAX_CHOICES} choices")
        return self

    def prompts(self) -> List[Union[str, List[int]]]:
        """The prompts of the request: one text, one list of token ids, or a list of either."""
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if not p:
            raise Unsupported("prompt", "is an empty list: give a text, token ids, or a list of them")
        return [p] if isinstance(p[0], int) else list(p)

    def num_logprobs(self) -> int:
        return -1 if self.logprobs is None else self.logprobs
