"""Exercise incremental-detok (chapter 13): stream token ids as text, never a broken character.

Write `IncrementalDetokenizer.add` and `IncrementalDetokenizer.flush`. The constructor, `_decode`
and `_byte_token` are the engine's. Grade with `python judge.py incremental-detok`.
"""

from typing import Sequence

from minisgl.tokenizer.detokenize import REPLACEMENT
from minisgl.tokenizer.detokenize import IncrementalDetokenizer as EngineDetokenizer


class IncrementalDetokenizer(EngineDetokenizer):
    def add(self, new_ids: Sequence[int]) -> str:
        """Append tokens; return the text that is now certain (possibly empty)."""
        raise NotImplementedError("incremental-detok: write IncrementalDetokenizer.add")

    def flush(self) -> str:
        """The request is over: return whatever is still held back."""
        raise NotImplementedError("incremental-detok: write IncrementalDetokenizer.flush")
