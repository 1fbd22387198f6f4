"""Exercise weight-stream (chapter 3): where each checkpoint tensor goes.

Write `_place`, the heart of the streaming loader: `load_checkpoint` reads the checkpoint one
tensor at a time, asks `_place` where it goes, checks the shape and copies it there. The engine's
`_qkv_part` is hidden while grading (write your own helper if you want one); `_shard_rows`,
`_find` and the tables `_MERGED`, `_ROW_PARALLEL`, `_VOCAB` are yours to use.
Grade with `python judge.py weight-stream`.
"""

import re
from typing import Optional, Tuple

import torch

from minisgl.models.weight import _MERGED, _ROW_PARALLEL, _VOCAB, _find, _shard_rows


def _place(model, params, name: str, tensor: torch.Tensor, tp) -> Tuple[Optional[str], Optional[slice], torch.Tensor]:
    """Where checkpoint tensor `name` goes on this tensor-parallel rank (`tp.rank` of `tp.size`).

    Returns (parameter name in `params`, row slice of it or None for all rows, the piece of
    `tensor` to copy there). Returns (None, None, tensor) when the model has no such parameter.
    """
    raise NotImplementedError("weight-stream: write _place")
