from .base import PREFIX_CACHES, BaseCacheHandle, BasePrefixCache, MatchResult, create_prefix_cache
from .mha_pool import MHAKVCache
from .naive_cache import NaivePrefixCache
from .radix_cache import RadixPrefixCache

__all__ = [
    "BaseCacheHandle",
    "BasePrefixCache",
    "MatchResult",
    "MHAKVCache",
    "NaivePrefixCache",
    "PREFIX_CACHES",
    "RadixPrefixCache",
    "create_prefix_cache",
]
