"""Wrong: reads the page table at position j instead of at page j's first position j * page_size."""

import itertools
from typing import List, Tuple

import torch


def page_layout(kv_lens: List[int], page_size: int) -> Tuple[List[int], List[int]]:
    pages = [(n + page_size - 1) // page_size for n in kv_lens]
    indptr = [0, *itertools.accumulate(pages)]
    last = [n - (p - 1) * page_size for n, p in zip(kv_lens, pages)]
    return indptr, last


def gather_page_indices_ref(page_table: torch.Tensor, rows: torch.Tensor, kv_indptr: torch.Tensor, page_size: int, total: int) -> torch.Tensor:
    counts = (kv_indptr[1:] - kv_indptr[:-1]).long()
    # for entry k of the flat list: which request owns it, and which of its pages it is
    owner = torch.repeat_interleave(torch.arange(len(counts), device=rows.device), counts, output_size=total)
    within = torch.arange(total, device=rows.device) - kv_indptr[:-1].long()[owner]
    slots = page_table[rows.long()[owner], within]
    return (slots // page_size).to(torch.int32)
