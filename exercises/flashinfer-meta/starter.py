"""Exercise flashinfer-meta (chapter 17): FlashInfer's view of a batch's KV.

Write `page_layout` (the page pointers and last-page lengths, from the lengths alone) and
`gather_page_indices_ref` (the page numbers, from the page table). The FlashInfer backend calls
both for every batch; on the CPU the engine's `gather_page_indices` falls back to yours.
Grade with `python judge.py flashinfer-meta`.
"""

from typing import List, Tuple

import torch


def page_layout(kv_lens: List[int], page_size: int) -> Tuple[List[int], List[int]]:
    """Returns `(kv_indptr, kv_last_page_len)` for requests with `kv_lens[i]` keys each (>= 1).

    kv_indptr: `[bs + 1]`, starting at 0: request i's pages are entries
        `kv_indptr[i] : kv_indptr[i + 1]` of the page list.
    kv_last_page_len: `[bs]`, how many positions of request i's last page hold keys
        (between 1 and page_size).
    """
    raise NotImplementedError("flashinfer-meta: write page_layout")


def gather_page_indices_ref(page_table: torch.Tensor, rows: torch.Tensor, kv_indptr: torch.Tensor, page_size: int, total: int) -> torch.Tensor:
    """The page list: for each request i (page-table row `rows[i]`), the page number of each of
    its pages `0 .. kv_indptr[i+1] - kv_indptr[i] - 1`, laid end to end. `total = kv_indptr[-1]`.

    page_table `[rows, max_seq_len]` holds the slot of every position; page j of a request starts
    at position `j * page_size`, and its page number is that slot divided by `page_size`.
    Returns `[total]` int32 on the page table's device.
    """
    raise NotImplementedError("flashinfer-meta: write gather_page_indices_ref")
