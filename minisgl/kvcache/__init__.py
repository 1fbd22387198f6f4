from .base import BaseCacheHandle, BasePrefixCache, MatchResult
from .mha_pool import MHAKVCache
from .naive_cache import NaivePrefixCache
from .radix_cache import RadixPrefixCache


def create_prefix_cache(kind: str, page_size: int, device) -> BasePrefixCache:
    if kind == "radix":
        return RadixPrefixCache(page_size, device)
    if kind == "naive":
        return NaivePrefixCache(device)
    raise ValueError(f"unknown prefix cache {kind!r}: choose 'radix' or 'naive'")


__all__ = [
    "BaseCacheHandle",
    "BasePrefixCache",
    "MatchResult",
    "MHAKVCache",
    "NaivePrefixCache",
    "RadixPrefixCache",
    "create_prefix_cache",
]
