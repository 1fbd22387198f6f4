"""The KV pool: one big tensor holding every layer's keys and values, addressed by slot."""

from __future__ import annotations

import torch


class MHAKVCache:
    """Layout `[2 (k/v), layers, pages * page_size, kv_heads, head_dim]`.

    A *slot* is one token's place in a layer (`page * page_size + offset`); the page table maps
    a request's positions to slots, so a request's KV need not be contiguous.
    """

    def __init__(self, num_layers: int, num_pages: int, page_size: int, num_kv_heads: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device):
        self.num_layers = num_layers
        self.num_pages = num_pages
        self.page_size = page_size
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        # left uninitialised: a slot is always written before it is read, except padding, which
        # reads the zeroed dummy page (see `zero_page`); untouched memory costs nothing on the CPU
        self.buffer = torch.empty(2, num_layers, num_pages * page_size, num_kv_heads, head_dim, dtype=dtype,
                                  device=device)

    def zero_page(self, page: int) -> None:
        self.buffer[:, :, page * self.page_size : (page + 1) * self.page_size].zero_()

    @property
    def num_slots(self) -> int:
        return self.num_pages * self.page_size

    @staticmethod
    def bytes_per_page(num_layers: int, page_size: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
        return 2 * num_layers * page_size * num_kv_heads * head_dim * torch.empty((), dtype=dtype).element_size()

    def k_cache(self, layer: int) -> torch.Tensor:
        return self.buffer[0, layer]  # [slots, kv_heads, head_dim]

    def v_cache(self, layer: int) -> torch.Tensor:
        return self.buffer[1, layer]

    def store_kv(self, k: torch.Tensor, v: torch.Tensor, out_loc: torch.Tensor, layer: int) -> None:
        """Write the new tokens' keys and values (`[tokens, kv_heads, head_dim]`) to their slots."""
        self.buffer[0, layer].index_copy_(0, out_loc, k)
        self.buffer[1, layer].index_copy_(0, out_loc, v)
