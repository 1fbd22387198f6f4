"""Wrong: moves the window even while the last character is incomplete, so the next window starts\ninside a character."""

from typing import Sequence

from minisgl.tokenizer.detokenize import REPLACEMENT
from minisgl.tokenizer.detokenize import IncrementalDetokenizer as EngineDetokenizer


class IncrementalDetokenizer(EngineDetokenizer):
    def add(self, new_ids: Sequence[int]) -> str:
        """Append tokens; return the text that is now certain (possibly empty)."""
        self.ids.extend(int(t) for t in new_ids)
        if not self.ids or self._byte_token(self.ids[-1]):
            return ""
        prefix_text = self._decode(self.ids[self.prefix_offset : self.read_offset])
        new_text = self._decode(self.ids[self.prefix_offset :])
        if len(new_text) <= len(prefix_text):
            return ""
        self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
        return new_text[len(prefix_text) :]

    def flush(self) -> str:
        """The request is over: return whatever is still held back, broken characters included
        (they are in the full decode too, so the total still matches it)."""
        prefix_text = self._decode(self.ids[self.prefix_offset : self.read_offset])
        new_text = self._decode(self.ids[self.prefix_offset :])
        self.prefix_offset = self.read_offset = len(self.ids)
        return new_text[len(prefix_text) :]
