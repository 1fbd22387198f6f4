"""What the API shows for a token next to its log-probability: its text and its bytes.

A token need not be whole characters: byte-level BPE spends up to four tokens on one emoji, and
decoding such a token alone gives U+FFFD. The bytes are exact either way -- recovered from the
token's piece through the byte-level alphabet (GPT-2's map of the 256 bytes onto printable
characters) or from a ``<0xNN>`` byte-fallback token -- and a token that is not valid UTF-8 on its
own is named by its bytes, ``bytes:\\xe4\\xbd``, as OpenAI does.
"""

from __future__ import annotations

import json
import re
from typing import Dict, List, Optional, Sequence, Tuple

from minisgl.message import TokenLogprob

_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def byte_level_alphabet() -> Dict[str, int]:
    """GPT-2's reversible map, inverted: printable bytes stand for themselves, the other 68 bytes
    (controls, space, a few Latin-1 ones) are moved to code points 256 and up, in byte order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars = {b: b for b in printable}
    extra = 0
    for b in range(256):
        if b not in chars:
            chars[b] = 256 + extra
            extra += 1
    return {chr(c): b for b, c in chars.items()}


def _is_byte_level(tokenizer) -> bool:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return False
    decoder = json.loads(backend.to_str()).get("decoder") or {}
    kinds = [decoder.get("type")] + [d.get("type") for d in decoder.get("decoders", [])]
    return "ByteLevel" in kinds


class TokenTexts:
    """Token id -> (text, bytes), cached: a vocabulary is decoded a token at a time only once."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.alphabet: Optional[Dict[str, int]] = byte_level_alphabet() if _is_byte_level(tokenizer) else None
        self._cache: Dict[int, Tuple[str, List[int]]] = {}

    def _bytes(self, token: int, text: str) -> List[int]:
        piece = self.tokenizer.convert_ids_to_tokens(token)
        if isinstance(piece, str):
            m = _BYTE_TOKEN.fullmatch(piece)
            if m:
                return [int(m.group(1), 16)]
            if self.alphabet is not None and all(c in self.alphabet for c in piece):
                return [self.alphabet[c] for c in piece]
        return list(text.encode("utf-8"))

    def get(self, token: int) -> Tuple[str, List[int]]:
        if token not in self._cache:
            text = self.tokenizer.decode([token], skip_special_tokens=False)
            raw = self._bytes(token, text)
            try:
                shown = bytes(raw).decode("utf-8")
            except UnicodeDecodeError:
                shown = "bytes:" + "".join(f"\\x{b:02x}" for b in raw)
            self._cache[token] = (shown, raw)
        return self._cache[token]

    def entry(self, token: int, logprob: float, top: Sequence[Tuple[int, float]] = ()) -> TokenLogprob:
        text, raw = self.get(token)
        alts = [TokenLogprob(self.get(t)[0], float(lp), self.get(t)[1]) for t, lp in top]
        return TokenLogprob(text, float(logprob), raw, alts)
