"""Cases for incremental-detok: streamed pieces for tricky text and random token sequences, with a
byte-level BPE (the SmolLM2 tokenizer) and a byte-fallback vocabulary."""

import random

from tokenizers import Tokenizer, decoders, models, normalizers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from judge import harness
from judge.api import Obs, case
from minisgl.tokenizer.detokenize import IncrementalDetokenizer

TRICKY = ["Bonjour 🤖 !", "你好，世界", "e\u0301t\u00e9 👨‍👩‍👧 🇫🇷", "日本語 and 한국어"]


# the SmolLM2 tokenizer, read once when the cases load (before the grading workers are forked)
BPE = AutoTokenizer.from_pretrained(harness.model_path("tiny-llama"))


def bpe():
    return BPE


def fallback():
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = len(vocab)
    for piece in ["▁", "▁the", "▁cat", "▁a", "a", "b", "c", "e", "h", "o", "t", "é"]:
        vocab[piece] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>", byte_fallback=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>")


def stream(obs: Obs, label: str, tok, ids) -> None:
    d = IncrementalDetokenizer(tok)
    pieces = [d.add([t]) for t in ids]
    pieces.append(d.flush())
    obs.eq(f"{label}: piece returned after each token, then flush()", pieces)
    obs.eq(f"{label}: the pieces add up to tokenizer.decode(all ids)", "".join(pieces) == tok.decode(ids, skip_special_tokens=True))


@case("emoji, CJK, accents and flags with a byte-level BPE", hint=2)
def bpe_tricky(obs: Obs) -> None:
    tok = bpe()
    for text in TRICKY:
        stream(obs, repr(text), tok, tok.encode(text, add_special_tokens=False))


@case("words and byte-fallback characters with a SentencePiece-style vocabulary", hint=1)
def fallback_tricky(obs: Obs) -> None:
    tok = fallback()
    for text in ["the cat", "a cat é", "the 你好 cat", "🤖 the"]:
        stream(obs, repr(text), tok, tok.encode(text, add_special_tokens=False))


@case("a special token at the end is skipped", hint=1)
def special(obs: Obs) -> None:
    tok = bpe()
    stream(obs, "'Hi there' then EOS", tok, tok.encode("Hi there", add_special_tokens=False) + [tok.eos_token_id])


@case("a sequence that ends inside a character", hint=3)
def broken_end(obs: Obs) -> None:
    tok = bpe()
    ids = tok.encode("ok 🤖", add_special_tokens=False)
    stream(obs, "'ok 🤖' without its last token", tok, ids[:-1])


@case("random token sequences", seeds=3, hint=2)
def random_sequences(obs: Obs, seed: int) -> None:
    rng = random.Random(seed)
    for name, tok in (("byte-level", bpe()), ("byte-fallback", fallback())):
        for i in range(6):
            hi = 259 if name == "byte-fallback" and i % 2 else len(tok)
            ids = [rng.randrange(3, hi) for _ in range(rng.randint(1, 25))]
            stream(obs, f"{name} sequence {i}", tok, ids)
