"""The request ledger (`Req`), the batch handed to the engine, and the global forward context."""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Iterator, List, Literal, Optional

import torch

if TYPE_CHECKING:
    from minisgl.attention.base import BaseAttnMetadata
    from minisgl.kvcache.base import BaseCacheHandle


class InvalidRequestError(ValueError):
    """A request a user can fix: the message says what is wrong and what to change."""


@dataclass(frozen=True)
class SamplingParams:
    """How one request picks its tokens. `temperature == 0` (or `top_k == 1`) means greedy."""

    max_tokens: int = 16
    temperature: float = 0.0
    top_k: int = -1  # -1: the whole vocabulary
    top_p: float = 1.0
    seed: Optional[int] = None
    ignore_eos: bool = False
    stop_token_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.max_tokens, int) or self.max_tokens <= 0:
            raise InvalidRequestError(f"max_tokens must be a positive integer, got {self.max_tokens!r}")
        if self.temperature < 0:
            raise InvalidRequestError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k == 0 or self.top_k < -1:
            raise InvalidRequestError(f"top_k must be -1 (off) or >= 1, got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise InvalidRequestError(f"top_p must be in (0, 1], got {self.top_p}")

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1


@dataclass(eq=False)
class Req:
    """One request's progress, written as three lengths over its token sequence.

    Invariant: ``0 <= cached_len < device_len <= max_device_len``.

    - ``cached_len``: tokens whose KV is already in the pool (reused or computed).
    - ``device_len``: tokens the next forward pass will have KV for; the gap is ``extend_len``.
    - ``max_device_len``: prompt plus ``max_tokens``; the gap to it is the room left to generate.

    While a long prompt is prefilled in chunks, ``device_len < prompt_len`` and the sampled token
    is thrown away. Token *values* reach the host later than lengths move (``append_host``), which
    is what lets the scheduler plan step N+1 while step N is still on the GPU.
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
        self.device_len = self.prompt_len
        self.max_device_len = self.prompt_len + self.sampling_params.max_tokens
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
        self.input_ids = torch.cat([self.input_ids, torch.tensor([next_token], dtype=torch.int32)])

    def __repr__(self) -> str:
        return (
            f"Req(uid={self.uid}, row={self.table_idx}, cached={self.cached_len}, "
            f"device={self.device_len}, max={self.max_device_len})"
        )


Phase = Literal["prefill", "decode"]


@dataclass
class Batch:
    """Requests forwarded together. Built in two passes: the scheduler picks ``reqs`` and
    ``phase``; ``prepare`` fills the tensors; the attention backend adds ``attn_metadata``."""

    reqs: List[Req]
    phase: Phase
    input_ids: Optional[torch.Tensor] = None  # [num_tokens] int32, on the device
    positions: Optional[torch.Tensor] = None  # [num_tokens] int64
    out_loc: Optional[torch.Tensor] = None  # [num_tokens] KV slots the new tokens are written to
    last_indices: Optional[torch.Tensor] = None  # [bs] each request's last token in the flat dim
    attn_metadata: Optional["BaseAttnMetadata"] = None
    padded_size: int = 0  # batch size after padding with dummy rows (CUDA graphs)

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
