"""A prefix cache that keeps nothing: every request computes its whole prompt."""

from __future__ import annotations

import torch

from .base import BaseCacheHandle, BasePrefixCache, MatchResult, register_prefix_cache


@register_prefix_cache("naive")
class NaivePrefixCache(BasePrefixCache):
    keeps_prefixes = False

    def __init__(self, page_size: int, device: torch.device):
        self._empty = torch.empty(0, dtype=torch.int32, device=device)

    def match_prefix(self, input_ids: torch.Tensor) -> MatchResult:
        return MatchResult(BaseCacheHandle(0), self._empty)

    def lock_handle(self, handle: BaseCacheHandle, unlock: bool = False) -> None:
        pass

    def insert_prefix(self, input_ids: torch.Tensor, indices: torch.Tensor) -> int:
        return len(input_ids)

    def evict(self, num_tokens: int) -> torch.Tensor:
        return self._empty

    @property
    def evictable_size(self) -> int:
        return 0

    @property
    def protected_size(self) -> int:
        return 0

    def all_indices(self) -> torch.Tensor:
        return self._empty

    def check_integrity(self) -> None:
        pass
