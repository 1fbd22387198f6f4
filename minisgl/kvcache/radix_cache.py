"""Radix prefix cache: a tree of token sequences whose KV slots outlive the requests that made them.

Each edge holds a run of tokens (a whole number of pages) and the slots of their KV. A request
that starts with a stored sequence reuses those slots instead of recomputing them. Running
requests lock the path they matched (reference counts up to the root); only unlocked leaves
are evicted, least recently used first.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

import torch

from .base import BaseCacheHandle, BasePrefixCache, MatchResult, register_prefix_cache


@dataclass(eq=False)
class RadixNode:
    key: torch.Tensor  # [n] int32 token ids on the CPU, n a multiple of page_size
    value: torch.Tensor  # [n] slot indices on the device
    parent: Optional["RadixNode"] = None
    children: Dict[Tuple[int, ...], "RadixNode"] = field(default_factory=dict)
    ref_count: int = 0
    last_access: int = 0

    @property
    def is_root(self) -> bool:
        return self.parent is None

    def __len__(self) -> int:
        return len(self.key)

    def __lt__(self, other: "RadixNode") -> bool:
        return self.last_access < other.last_access


@dataclass
class RadixCacheHandle(BaseCacheHandle):
    node: RadixNode = None  # the deepest matched node; the path above it is the prefix


def _common_len(a: torch.Tensor, b: torch.Tensor) -> int:
    n = min(len(a), len(b))
    diff = (a[:n] != b[:n]).nonzero()
    return int(diff[0]) if len(diff) else n


@register_prefix_cache("radix")
class RadixPrefixCache(BasePrefixCache):
    def __init__(self, page_size: int, device: torch.device):
        self.page_size = page_size
        self.device = device
        self._clock = 0
        self.reset()

    def reset(self) -> None:
        empty = torch.empty(0, dtype=torch.int32)
        self.root = RadixNode(key=empty, value=empty.to(self.device), ref_count=1)
        self._evictable = 0
        self._protected = 0

    def _tick(self) -> int:
        self._clock += 1
        return self._clock

    def _edge(self, ids: torch.Tensor, start: int) -> Tuple[int, ...]:
        return tuple(ids[start : start + self.page_size].tolist())

    def _split(self, node: RadixNode, at: int) -> RadixNode:
        """Cut `node`'s edge after `at` tokens; return the new upper node (same locks)."""
        upper = RadixNode(node.key[:at], node.value[:at], node.parent, {}, node.ref_count, node.last_access)
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

    def _nodes(self) -> List[RadixNode]:
        out, stack = [], list(self.root.children.values())
        while stack:
            n = stack.pop()
            out.append(n)
            stack.extend(n.children.values())
        return out

    @property
    def evictable_size(self) -> int:
        return self._evictable

    @property
    def protected_size(self) -> int:
        return self._protected

    def all_indices(self) -> torch.Tensor:
        values = [n.value for n in self._nodes()]
        return torch.cat(values) if values else self.root.value

    def check_integrity(self) -> None:
        evictable = protected = 0
        for n in self._nodes():
            assert len(n) > 0 and len(n) % self.page_size == 0, "edge length is not a positive number of pages"
            assert len(n.key) == len(n.value), "edge key and value lengths differ"
            assert n.parent.children.get(self._edge(n.key, 0)) is n, "child is not filed under its first page"
            assert n.ref_count >= 0, "negative reference count"
            if not n.parent.is_root:
                assert n.parent.ref_count >= n.ref_count, "a locked node's parent is not locked"
            for key, child in n.children.items():
                assert child.parent is n and key == self._edge(child.key, 0), "child is not filed under its first page"
            if n.ref_count == 0:
                evictable += len(n)
            else:
                protected += len(n)
        assert (evictable, protected) == (self._evictable, self._protected), (
            f"size counters drifted: counted {evictable}/{protected}, recorded {self._evictable}/{self._protected}"
        )
        slots = self.all_indices()
        assert len(torch.unique(slots)) == len(slots), "a KV slot is stored twice in the tree"

    def to_text(self, tokens_to_str=None, max_tokens: int = 8) -> str:
        """An indented picture of the tree (for the notebooks and debugging)."""
        lines: List[str] = []

        def show(node: RadixNode, depth: int) -> None:
            for child in sorted(node.children.values(), key=lambda c: c.key.tolist()):
                ids = child.key.tolist()
                more = "..." if len(ids) > max_tokens else ""
                label = tokens_to_str(ids) if tokens_to_str else str(ids[:max_tokens]) + more
                lines.append(f"{'  ' * depth}- {label!s} (len={len(child)}, ref={child.ref_count})")
                show(child, depth + 1)

        show(self.root, 0)
        return "\n".join(lines) or "(empty)"
