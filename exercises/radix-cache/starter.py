"""Exercise radix-cache (chapter 9): the radix prefix cache.

Write the four methods below. The node and handle classes, `_nodes`, the size properties,
`all_indices`, `check_integrity` and `to_text` are the engine's. You may also write helpers; the
engine's own `_walk` and `_split` are hidden while grading, so write your own if you want them.
Grade with `python judge.py radix-cache`.
"""

from typing import List, Tuple

import heapq
import torch

from minisgl.kvcache.base import BaseCacheHandle, MatchResult
from minisgl.kvcache.radix_cache import RadixCacheHandle, RadixNode, _common_len
from minisgl.kvcache.radix_cache import RadixPrefixCache as EngineRadixPrefixCache


class RadixPrefixCache(EngineRadixPrefixCache):
    def match_prefix(self, input_ids: torch.Tensor) -> MatchResult:
        """Longest stored prefix of `input_ids` in whole pages (split an edge matched only partly);
        touch the nodes on the path (LRU). Returns MatchResult(RadixCacheHandle(cached_len, node), slots)."""
        raise NotImplementedError("radix-cache: write RadixPrefixCache.match_prefix")

    def lock_handle(self, handle: BaseCacheHandle, unlock: bool = False) -> None:
        """Add (or remove) one reference on every node from `handle.node` up to the root, moving
        sizes between evictable and protected when a count leaves (or reaches) zero."""
        raise NotImplementedError("radix-cache: write RadixPrefixCache.lock_handle")

    def insert_prefix(self, input_ids: torch.Tensor, indices: torch.Tensor) -> int:
        """Store `input_ids` -> `indices` (page-aligned). Returns the length that was already
        stored: the caller keeps (and frees) those slots; the cache owns the rest."""
        raise NotImplementedError("radix-cache: write RadixPrefixCache.insert_prefix")

    def evict(self, num_tokens: int) -> torch.Tensor:
        """Remove unlocked leaves, least recently used first (a parent that becomes an unlocked
        leaf is a candidate too), until `num_tokens` slots are freed or none are left; return them."""
        raise NotImplementedError("radix-cache: write RadixPrefixCache.evict")
