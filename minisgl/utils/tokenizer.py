"""A model folder's Hugging Face tokenizer, read once per process.

Parsing `tokenizer.json` (the whole vocabulary and its merges) is the slow part of building an `LLM`
on a small model; a process that builds several engines on one folder (a notebook, a test run, the
scheduler and the helpers beside it) parses it once. The engine only reads from a tokenizer
(encode, decode, chat template), so one object serves them all. Also here: whether a tokenizer can
render a chat, and the stand-in that random weights get when their folder has no tokenizer.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Any, Tuple

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")


def has_tokenizer(model_path: str | Path) -> bool:
    """Whether the folder holds a tokenizer (a config-only folder for speed runs does not)."""
    return any((Path(model_path) / name).exists() for name in TOKENIZER_FILES)


def load_tokenizer(model_path: str | Path) -> Any:
    """`AutoTokenizer.from_pretrained(model_path)`, shared with earlier callers while the folder's
    tokenizer files are unchanged."""
    folder = Path(model_path).resolve()
    return _load(str(folder), _signature(folder))


def _signature(folder: Path) -> Tuple[Tuple[str, int, int], ...]:
    files = (folder / name for name in TOKENIZER_FILES + ("special_tokens_map.json", "chat_template.jinja"))
    return tuple((f.name, f.stat().st_mtime_ns, f.stat().st_size) for f in files if f.exists())


@functools.lru_cache(maxsize=4)
def _load(folder: str, signature: Tuple[Tuple[str, int, int], ...]) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(folder)


def template_source(tokenizer: Any) -> str:
    """The default chat template's Jinja text ('' when the tokenizer has none)."""
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):  # named templates: "default" is the one apply_chat_template uses
        template = template.get("default")
    return template if isinstance(template, str) else ""


NO_CHAT_TEMPLATE = ("the model's tokenizer has no chat template: send the text as a plain prompt (/v1/completions, "
                    "or LLM.generate without chat=True), or use a tokenizer that has one")


def has_chat_template(tokenizer: Any) -> bool:
    return bool(template_source(tokenizer))


PLACEHOLDER = "placeholder: token i reads <i>"  # the stand-in's name_or_path
PLACEHOLDER_TEXT = re.compile(r"(?:<\d+>)+")  # all the stand-in can encode; any other text would become <0>


def placeholder_tokenizer(vocab_size: int) -> Any:
    """A tokenizer whose token i reads "<i>" (and "<i>" encodes to i): readable text for random
    weights whose vocabulary no tokenizer at hand covers."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(vocab={f"<{i}>": i for i in range(vocab_size)}, unk_token="<0>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"<\d+>"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<0>", name_or_path=PLACEHOLDER)


def is_placeholder(tokenizer: Any) -> bool:
    return getattr(tokenizer, "name_or_path", None) == PLACEHOLDER
