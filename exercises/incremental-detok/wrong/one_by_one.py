"""Wrong: no window: each call decodes only the new ids, so characters split over tokens break
and a word-start space is lost."""

from typing import Sequence

from minisgl.tokenizer.detokenize import REPLACEMENT
from minisgl.tokenizer.detokenize import IncrementalDetokenizer as EngineDetokenizer


class IncrementalDetokenizer(EngineDetokenizer):
    def add(self, new_ids: Sequence[int]) -> str:
        """Append tokens; return the text that is now certain (possibly empty)."""
        self.ids.extend(int(t) for t in new_ids)
        if not self.ids or self._byte_token(self.ids[-1]):
            return ""
        text = self._decode(self.ids[self.read_offset :])
        self.read_offset = len(self.ids)
        return text

    def flush(self) -> str:
        return ""
