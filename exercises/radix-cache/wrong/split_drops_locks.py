"""Wrong: splitting an edge gives the new upper node no references, so a split of a locked edge drops
the locks on its first half."""

from typing import List, Tuple

import heapq
import torch

from minisgl.kvcache.base import BaseCacheHandle, MatchResult
from minisgl.kvcache.radix_cache import RadixCacheHandle, RadixNode, _common_len
from minisgl.kvcache.radix_cache import RadixPrefixCache as EngineRadixPrefixCache


class RadixPrefixCache(EngineRadixPrefixCache):
    def _split(self, node: RadixNode, at: int) -> RadixNode:
        """Cut `node`'s edge after `at` tokens; return the new upper node (same locks)."""
        upper = RadixNode(node.key[:at], node.value[:at], node.parent, {}, 0, node.last_access)
        node.parent.children[self._edge(upper.key, 0)] = upper
        node.key, node.value, node.parent = node.key[at:], node.value[at:], upper
        upper.children[self._edge(node.key, 0)] = node
        return upper

    def _walk(self, ids: torch.Tensor) -> Tuple[RadixNode, int, List[torch.Tensor]]:
        """Follow `ids` down the tree, splitting an edge that matches only partly."""
        node, pos, values, now = self.root, 0, [], self._tick()
        while pos + self.page_size <= len(ids):
            child = node.children.get(self._edge(ids, pos))
            if child is None:
                break
            m = _common_len(child.key, ids[pos:])
            m -= m % self.page_size
            if m < len(child):
                child = self._split(child, m)
            child.last_access = now
            values.append(child.value)
            node, pos = child, pos + m  # after a split the next lookup misses and the walk ends
        return node, pos, values

    def match_prefix(self, input_ids: torch.Tensor) -> MatchResult:
        node, pos, values = self._walk(input_ids)
        indices = torch.cat(values) if values else self.root.value
        return MatchResult(RadixCacheHandle(cached_len=pos, node=node), indices)

    def lock_handle(self, handle: BaseCacheHandle, unlock: bool = False) -> None:
        assert isinstance(handle, RadixCacheHandle)
        node = handle.node
        while node is not None and not node.is_root:
            if unlock:
                assert node.ref_count > 0, "unlock without a matching lock"
                node.ref_count -= 1
                if node.ref_count == 0:
                    self._protected -= len(node)
                    self._evictable += len(node)
            else:
                if node.ref_count == 0:
                    self._evictable -= len(node)
                    self._protected += len(node)
                node.ref_count += 1
            node = node.parent

    def insert_prefix(self, input_ids: torch.Tensor, indices: torch.Tensor) -> int:
        assert len(input_ids) == len(indices) and len(input_ids) % self.page_size == 0
        node, pos, _ = self._walk(input_ids)
        if pos < len(input_ids):
            leaf = RadixNode(input_ids[pos:].clone(), indices[pos:].clone(), node, last_access=self._tick())
            node.children[self._edge(leaf.key, 0)] = leaf
            self._evictable += len(leaf)
        return pos

    def evict(self, num_tokens: int) -> torch.Tensor:
        leaves = [n for n in self._nodes() if not n.children and n.ref_count == 0]
        heapq.heapify(leaves)
        freed: List[torch.Tensor] = []
        count = 0
        while count < num_tokens and leaves:
            leaf = heapq.heappop(leaves)
            parent = leaf.parent
            del parent.children[self._edge(leaf.key, 0)]
            freed.append(leaf.value)
            count += len(leaf)
            self._evictable -= len(leaf)
            if not parent.is_root and not parent.children and parent.ref_count == 0:
                heapq.heappush(leaves, parent)
        return torch.cat(freed) if freed else self.root.value
