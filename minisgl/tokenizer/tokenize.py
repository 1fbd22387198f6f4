"""Text (or a chat) in, token ids out -- the same way the offline `LLM` does it, so a prompt
sent to the server and the same prompt given to `LLM.generate` run the very same tokens."""

from __future__ import annotations

from typing import Dict, List, Union

from minisgl.core import InvalidRequestError

Prompt = Union[str, List[int], List[Dict[str, str]]]


class TokenizeManager:
    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.vocab_size = len(tokenizer)

    def encode(self, prompt: Prompt, chat: bool) -> List[int]:
        if chat:
            if not isinstance(prompt, list) or not all(isinstance(m, dict) for m in prompt):
                raise InvalidRequestError("messages must be a list of {role, content} objects")
            ids = self.tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True, return_dict=False)
            return [int(t) for t in ids]
        if isinstance(prompt, str):
            # no BOS added: the same choice as LLM.encode; fall back for tokenizers that need one
            return self.tokenizer.encode(prompt, add_special_tokens=False) or self.tokenizer.encode(prompt)
        bad = [t for t in prompt if not isinstance(t, int) or not 0 <= t < self.vocab_size]
        if bad:
            raise InvalidRequestError(f"prompt: token id {bad[0]!r} is not in the vocabulary [0, {self.vocab_size})")
        return list(prompt)
