"""What every prefix cache promises the cache manager."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Callable, Dict, NamedTuple

import torch

from minisgl.core import BaseCacheHandle  # declared with the request that holds it


class MatchResult(NamedTuple):
    handle: BaseCacheHandle
    indices: torch.Tensor  # [cached_len] slots of the matched prefix


class BasePrefixCache(ABC):
    # False for a cache that stores nothing: then no request waits for another's prefix (it
    # would never become a hit)
    keeps_prefixes: bool = True

    @abstractmethod
    def match_prefix(self, input_ids: torch.Tensor) -> MatchResult:
        """Longest stored prefix of `input_ids` (whole pages only). Does not lock it."""

    @abstractmethod
    def lock_handle(self, handle: BaseCacheHandle, unlock: bool = False) -> None:
        """A locked prefix cannot be evicted; each lock must be paired with an unlock."""

    @abstractmethod
    def insert_prefix(self, input_ids: torch.Tensor, indices: torch.Tensor) -> int:
        """Offer the slots of `input_ids` (page-aligned length) to the cache.

        Returns how many leading slots the cache did *not* take: the caller still owns (and must
        free) `indices[handle.cached_len : returned]`; the cache owns everything after.
        """

    @abstractmethod
    def evict(self, num_tokens: int) -> torch.Tensor:
        """Drop unlocked entries (least recently used first) to free at least `num_tokens` slots,
        or as many as there are; returns the freed slots."""

    @property
    @abstractmethod
    def evictable_size(self) -> int:
        """Slots held by the cache and not locked by any running request."""

    @property
    @abstractmethod
    def protected_size(self) -> int:
        """Slots held by the cache and locked."""

    @property
    def size(self) -> int:
        return self.evictable_size + self.protected_size

    @abstractmethod
    def all_indices(self) -> torch.Tensor:
        """Every slot the cache holds (for the manager's integrity check)."""

    @abstractmethod
    def check_integrity(self) -> None:
        """Raise AssertionError if the cache's internal bookkeeping is inconsistent."""


# The prefix caches by name, each registered by the module that defines it: (page_size, device) -> cache
PREFIX_CACHES: Dict[str, Callable[[int, torch.device], BasePrefixCache]] = {}


def register_prefix_cache(name: str) -> Callable[[type], type]:
    """Class decorator: make a prefix cache available as `SchedulerConfig(prefix_cache=name)`."""
    def register(cls: type) -> type:
        PREFIX_CACHES[name] = cls
        return cls
    return register


def create_prefix_cache(kind: str, page_size: int, device: torch.device) -> BasePrefixCache:
    if kind not in PREFIX_CACHES:
        raise ValueError(f"unknown prefix cache {kind!r}: choose one of {', '.join(sorted(PREFIX_CACHES))}")
    return PREFIX_CACHES[kind](page_size, device)
