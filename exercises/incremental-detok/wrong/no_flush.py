"""Wrong: flush returns nothing, so text held back at the end (a trailing broken character) is lost."""

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
        if len(new_text) <= len(prefix_text) or new_text.endswith(REPLACEMENT):
            return ""
        assert new_text.startswith(prefix_text), "the decoder rewrote text it had already produced"
        self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
        return new_text[len(prefix_text) :]

    def flush(self) -> str:
        return ""
