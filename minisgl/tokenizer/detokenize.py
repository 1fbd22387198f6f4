"""Turning a stream of token ids back into a stream of text, one token at a time.

Decoding each token alone is wrong in two ways: a character may be split over several tokens
(byte-level BPE spends up to four tokens on an emoji; byte-fallback vocabularies spell rare
characters as ``<0xE4>`` tokens), and some decoders change a token's text by what precedes it
(a SentencePiece word-start space is dropped at the start of a string). So we decode a small
window that starts a little *before* the new tokens and subtract the text that window had
already produced:

    ids:        ... | prefix_offset ........ read_offset ........ len(ids)
    prefix_text  =  decode(ids[prefix_offset:read_offset])      (already sent)
    new_text     =  decode(ids[prefix_offset:])                   (sent + maybe something new)

If `new_text` ends in U+FFFD the last character is still incomplete: send nothing and wait for
the next token. Byte-fallback vocabularies need one more rule: their decoder turns a whole run of
``<0xNN>`` tokens into text at once, and an invalid run becomes one U+FFFD per byte -- so a later
byte token can change how earlier ones read. We therefore also wait while the last token is a
byte token; the window then always starts and ends on a run boundary. Otherwise send
``new_text[len(prefix_text):]`` and slide the window. Concatenating every piece gives exactly
``tokenizer.decode(all_ids)``: a window never starts inside a character, because `read_offset`
only moves once the text up to it decodes cleanly.
"""

from __future__ import annotations

import re
from typing import Dict, List, Sequence

REPLACEMENT = "\ufffd"
_BYTE_TOKEN = re.compile(r"<0x[0-9A-Fa-f]{2}>")


class IncrementalDetokenizer:
    def __init__(self, tokenizer, skip_special_tokens: bool = True):
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.ids: List[int] = []
        self.prefix_offset = 0  # start of the decode window
        self.read_offset = 0  # tokens before this are already in the emitted text
        self._is_byte: Dict[int, bool] = {}

    def _byte_token(self, token: int) -> bool:
        if token not in self._is_byte:
            piece = self.tokenizer.convert_ids_to_tokens(token)
            self._is_byte[token] = isinstance(piece, str) and _BYTE_TOKEN.fullmatch(piece) is not None
        return self._is_byte[token]

    def _decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)

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
        """The request is over: return whatever is still held back, broken characters included
        (they are in the full decode too, so the total still matches it)."""
        prefix_text = self._decode(self.ids[self.prefix_offset : self.read_offset])
        new_text = self._decode(self.ids[self.prefix_offset :])
        self.prefix_offset = self.read_offset = len(self.ids)
        return new_text[len(prefix_text) :]


class StopStringFilter:
    """Holds back text that might be the start of a stop string, and cuts at the first match.

    ``push(text) -> (safe_text, stopped)``: `safe_text` can be sent now; once `stopped` is True
    the request is over and the stop string itself is never sent (OpenAI semantics).
    """

    def __init__(self, stop: Sequence[str]):
        self.stop = [s for s in stop if s]
        self.pending = ""  # received but not yet safe to send

    def push(self, text: str) -> tuple[str, bool]:
        if not self.stop:
            return text, False
        self.pending += text
        hits = [i for i in (self.pending.find(s) for s in self.stop) if i >= 0]
        if hits:
            out, self.pending = self.pending[: min(hits)], ""
            return out, True
        # keep the longest tail that is a proper prefix of some stop string
        keep = 0
        for s in self.stop:
            for k in range(min(len(s) - 1, len(self.pending)), keep, -1):
                if self.pending.endswith(s[:k]):
                    keep = k
                    break
        out = self.pending[: len(self.pending) - keep]
        self.pending = self.pending[len(out) :]
        return out, False

    def flush(self) -> str:
        out, self.pending = self.pending, ""
        return out
