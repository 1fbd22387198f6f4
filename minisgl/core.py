"""The request ledger (`Req`), the batch handed to the engine, and the global forward context."""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterator, List, Literal, Optional

import torch


class InvalidRequestError(ValueError):
    """A request a user can fix: the message says what is wrong and what to change."""


def too_long(n: int, max_tokens: int, limit: int, why: str) -> str:
    """The refusal of a prompt of `n` tokens with `max_tokens` when the two may add up to at most
    `limit`, with a fix that is accepted when followed."""
    head = f"prompt has {n} tokens and max_tokens is {max_tokens}, but {why}"
    if n < limit:
        return f"{head}: lower max_tokens to at most {limit - n}, or shorten the prompt"
    if max_tokens < limit:
        return f"{head}: shorten the prompt to at most {limit - max_tokens} tokens"
    return f"{head}: shorten the prompt and lower max_tokens so that together they are at most {limit}"


def is_int(x: object) -> bool:
    """An integer, and not a bool (which Python counts as one)."""
    return isinstance(x, int) and not isinstance(x, bool)


def _in_range(name: str, x: object, lo: float, hi: float) -> None:
    # `not lo <= x <= hi` is also true for NaN
    if isinstance(x, bool) or not isinstance(x, (int, float)) or not lo <= x <= hi:
        raise InvalidRequestError(f"{name} must be a number in [{lo}, {hi}], got {x!r}")


@dataclass(frozen=True)
class SamplingParams:
    """How one request picks its tokens. `temperature == 0` (or `top_k == 1`) means greedy.

    Penalties and biases change the logits before sampling (so they apply to greedy requests
    too): `repetition_penalty` as in transformers (divide a positive logit, multiply a negative
    one, for every token already in the prompt or the output), `frequency_penalty` and
    `presence_penalty` as in OpenAI (subtract `count * frequency + (count > 0) * presence`, over
    the output's tokens), `logit_bias` added per token id. `min_p` keeps tokens whose probability
    is at least `min_p` times the most likely one's.

    A later module whose feature a request may ask for adds its fields to this class; a scheduler
    without that feature refuses a request that sets them.
    """

    max_tokens: int = 16
    temperature: float = 0.0
    top_k: int = -1  # -1: the whole vocabulary
    top_p: float = 1.0
    seed: Optional[int] = None  # any 64-bit value: 0 <= seed < 2**64
    ignore_eos: bool = False
    stop_token_ids: tuple[int, ...] = ()
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0  # 1: off
    min_p: float = 0.0  # 0: off
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias) pairs
    min_tokens: int = 0  # end-of-sequence and stop tokens are masked until this many are out

    def __post_init__(self) -> None:
        if not is_int(self.max_tokens) or self.max_tokens <= 0:
            raise InvalidRequestError(f"max_tokens must be a positive integer, got {self.max_tokens!r}")
        if self.temperature < 0:
            raise InvalidRequestError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k == 0 or self.top_k < -1:
            raise InvalidRequestError(f"top_k must be -1 (off) or >= 1, got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise InvalidRequestError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.seed is not None and (not is_int(self.seed) or not 0 <= self.seed < 2**64):
            raise InvalidRequestError(f"seed must be an integer in [0, 2**64), got {self.seed!r}")
        if not isinstance(self.stop_token_ids, tuple) or not all(is_int(t) and t >= 0 for t in self.stop_token_ids):
            raise InvalidRequestError("stop_token_ids must be a tuple of token ids (integers >= 0), got "
                                      f"{self.stop_token_ids!r}")
        _in_range("presence_penalty", self.presence_penalty, -2.0, 2.0)
        _in_range("frequency_penalty", self.frequency_penalty, -2.0, 2.0)
        rp = self.repetition_penalty
        if isinstance(rp, bool) or not isinstance(rp, (int, float)) or not 0 < rp < float("inf"):
            raise InvalidRequestError("repetition_penalty must be a number > 0 (1 is off), got "
                                      f"{self.repetition_penalty!r}")
        _in_range("min_p", self.min_p, 0.0, 1.0)
        self._check_logit_bias()
        # min_tokens <= max_tokens is checked by the scheduler, once max_tokens is final
        if not is_int(self.min_tokens) or self.min_tokens < 0:
            raise InvalidRequestError(f"min_tokens must be an integer >= 0, got {self.min_tokens!r}")

    def _check_logit_bias(self) -> None:
        if not isinstance(self.logit_bias, tuple):
            raise InvalidRequestError("logit_bias must be a tuple of (token_id, bias) pairs, got "
                                      f"{type(self.logit_bias).__name__}")
        seen = set()
        for pair in self.logit_bias:
            if not (isinstance(pair, tuple) and len(pair) == 2 and is_int(pair[0]) and pair[0] >= 0):
                raise InvalidRequestError(f"logit_bias entries must be (token_id >= 0, bias) pairs, got {pair!r}")
            _in_range(f"logit_bias for token {pair[0]}", pair[1], -100.0, 100.0)
            if pair[0] in seen:
                raise InvalidRequestError(f"logit_bias names token {pair[0]} twice: give each token one bias")
            seen.add(pair[0])

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1

    @property
    def uses_penalties(self) -> bool:
        """True when the logits depend on the tokens seen so far."""
        return self.presence_penalty != 0 or self.frequency_penalty != 0 or self.repetition_penalty != 1


@dataclass(eq=False)
class Req:
    """One request's progress, written as three lengths over its token sequence.

    Invariant: ``0 <= cached_len < device_len <= max_device_len``.

    - ``cached_len``: tokens whose KV is already in the pool (reused or computed).
    - ``device_len``: tokens the next forward pass will have KV for; the gap is ``extend_len``.
    - ``max_device_len``: prompt plus ``max_tokens``; the gap to it is the room left to generate.

    A step may compute only part of the prompt: then ``device_len < prompt_len`` and the sampled
    token is thrown away. Token *values* reach the host later than lengths move (``append_host``):
    lengths are all the scheduler needs to plan a step.
    """

    input_ids: torch.Tensor  # [n] int32 on the CPU: the prompt, then tokens as they arrive
    table_idx: int
    cached_len: int
    uid: int
    sampling_params: SamplingParams
    cache_handle: "BaseCacheHandle"
    seed: int = 0  # per-request sampling seed (derived from the params, or drawn at admission)
    finished: bool = False
    finish_reason: Optional[str] = None

    def __post_init__(self) -> None:
        assert self.input_ids.device.type == "cpu" and self.input_ids.dim() == 1
        self.prompt_len = len(self.input_ids)
        self.reused_len = self.cached_len  # prompt tokens the prefix cache held at admission
        self.device_len = self.prompt_len
        self.max_device_len = self.prompt_len + self.sampling_params.max_tokens
        # room for every token the request can hold: `append_host` writes one, it copies nothing
        self._ids = torch.empty(self.max_device_len, dtype=torch.int32)
        self._ids[: self.prompt_len] = self.input_ids
        self._ids_np = self._ids.numpy()  # the same memory; a numpy write costs no tensor op
        self.input_ids = self._ids[: self.prompt_len]
        self.check()

    def check(self) -> None:
        assert 0 <= self.cached_len < self.device_len <= self.max_device_len, (
            f"req {self.uid}: ledger broken: cached_len={self.cached_len}, "
            f"device_len={self.device_len}, max_device_len={self.max_device_len}"
        )

    @property
    def extend_len(self) -> int:
        return self.device_len - self.cached_len

    @property
    def remain_len(self) -> int:
        return self.max_device_len - self.device_len

    @property
    def is_chunk(self) -> bool:
        """True while this step computes only part of the prompt: the token it samples is thrown away."""
        return self.device_len < self.prompt_len

    @property
    def can_decode(self) -> bool:
        return not self.finished and not self.is_chunk and self.remain_len > 0

    @property
    def output_ids(self) -> torch.Tensor:
        return self.input_ids[self.prompt_len :]

    def complete_one(self) -> None:
        """The forward pass for [cached_len, device_len) is launched: move the lengths on."""
        if self.is_chunk:
            # the next chunk's size is set by the scheduler; until then the whole rest is pending
            self.cached_len, self.device_len = self.device_len, self.prompt_len
        else:
            self.cached_len = self.device_len
            self.device_len += 1
        self.check()

    def append_host(self, next_token: int) -> None:
        n = self.input_ids.shape[0]
        self._ids_np[n] = next_token
        self.input_ids = self._ids[: n + 1]

    def __repr__(self) -> str:
        return (
            f"Req(uid={self.uid}, row={self.table_idx}, cached={self.cached_len}, "
            f"device={self.device_len}, max={self.max_device_len})"
        )


Phase = Literal["prefill", "decode"]


@dataclass
class Batch:
    """Requests forwarded together. Built in two passes: the scheduler picks ``reqs`` and
    ``phase``; the scheduler's ``prepare`` fills the tensors; the attention backend adds ``attn_metadata``."""

    reqs: List[Req]
    phase: Phase
    input_ids: Optional[torch.Tensor] = None  # [num_tokens] int32, on the device
    positions: Optional[torch.Tensor] = None  # [num_tokens] int64
    out_loc: Optional[torch.Tensor] = None  # [num_tokens] KV slots the new tokens are written to
    last_indices: Optional[torch.Tensor] = None  # [bs] each request's last token in the flat dim
    attn_metadata: Optional["BaseAttnMetadata"] = None

    @property
    def size(self) -> int:
        return len(self.reqs)

    @property
    def is_prefill(self) -> bool:
        return self.phase == "prefill"

    @property
    def is_decode(self) -> bool:
        return self.phase == "decode"

    @property
    def num_tokens(self) -> int:
        return sum(r.extend_len for r in self.reqs)


@dataclass
class Context:
    """What a forward pass needs that is not passed through every layer's arguments."""

    page_size: int
    kv_cache: "object" = None
    attn_backend: "object" = None
    batch: Optional[Batch] = field(default=None)

    @contextmanager
    def forward_batch(self, batch: Batch) -> Iterator[None]:
        assert self.batch is None, "forward passes do not nest"
        self.batch = batch
        try:
            yield
        finally:
            self.batch = None


_GLOBAL_CTX: Optional[Context] = None


def set_global_ctx(ctx: Optional[Context]) -> None:
    global _GLOBAL_CTX
    _GLOBAL_CTX = ctx


def get_global_ctx() -> Context:
    assert _GLOBAL_CTX is not None, "no engine is running: build an Engine first"
    return _GLOBAL_CTX


class BaseAttnMetadata:
    """Per-batch facts an attention backend precomputes once and every layer reuses (each backend
    subclasses it). Declared here, with the `Batch` that carries it, so that the attention package
    builds on this module and not the other way round."""


@dataclass
class BaseCacheHandle:
    """A prefix cache's receipt for a matched prefix: `cached_len` tokens whose slots the cache
    owns (a cache that needs more subclasses it). Declared here, with the `Req` that holds one, so that the
    prefix caches build on this module and not the other way round."""

    cached_len: int
