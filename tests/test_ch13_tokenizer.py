"""Chapter 13: the tokenizer worker and the incremental detokenizer.

Oracle: `tokenizer.decode(all_ids)`. Streaming must add up to it exactly, never send text it later
contradicts, and never send a broken character (U+FFFD) for text that is valid -- for a
byte-level BPE (SmolLM2) and for a SentencePiece-style byte-fallback vocabulary built here.
"""

from __future__ import annotations

import random
from typing import List

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, normalizers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from minisgl.core import InvalidRequestError, SamplingParams
from minisgl.message import AbortMsg, DetokenizeMsg, ErrorReply, SchedulerErrorMsg, TokenizeMsg, UserMsg, UserReply
from minisgl.tokenizer import IncrementalDetokenizer, StopStringFilter, TokenizeManager
from minisgl.tokenizer.worker import TokenizerWorker
from minisgl.utils.tokenizer import placeholder_tokenizer

from helpers import SMOLLM2

TRICKY = [
    "héllo wörld",
    "你好，世界！这是一个测试。",
    "日本語のテキストと한국어",
    "emoji 🤖🎉 and a family 👨‍👩‍👧‍👦 and flags 🇫🇷🇯🇵",
    "combining: e\u0301 a\u0308 ñ",
    "math ∑∫√∞ ≠ ≤ and arrows → ⇒",
    "tabs\tand\r\nnewlines\n\n  spaces  ",
    "mixed: a😀b你c🇩🇪d",
    "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 outside the BMP 𐍈",
]


@pytest.fixture(scope="module")
def smol_tok():
    return AutoTokenizer.from_pretrained(SMOLLM2)


@pytest.fixture(scope="module")
def fallback_tok():
    """A Llama-style vocabulary: word pieces with a '▁' word-start mark, and <0xNN> byte tokens
    for every character it lacks (so a CJK character or an emoji is 3-4 byte tokens)."""
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = len(vocab)
    for piece in ["▁", "▁the", "▁cat", "▁a", "a", "b", "c", "d", "e", "h", "l", "o", "r", "s", "t", "w", "é", "."]:
        vocab[piece] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>", byte_fallback=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>")


def stream(tokenizer, ids: List[int], rng: random.Random | None = None) -> List[str]:
    """Feed `ids` in random-sized groups (1 to 3 tokens, as steps may deliver); flush at the end."""
    detok = IncrementalDetokenizer(tokenizer)
    pieces, i = [], 0
    while i < len(ids):
        n = rng.randint(1, 3) if rng else 1
        pieces.append(detok.add(ids[i : i + n]))
        i += n
    pieces.append(detok.flush())
    return pieces


def check_stream(tokenizer, ids: List[int], pieces: List[str]) -> None:
    full = tokenizer.decode(ids, skip_special_tokens=True)
    assert "".join(pieces) == full
    sent = ""
    for p in pieces:
        sent += p
        assert full.startswith(sent), "sent text that the full decode contradicts"


@pytest.mark.parametrize("which", ["smol_tok", "fallback_tok"])
def test_random_token_sequences_add_up_to_the_full_decode(which, request):
    tok = request.getfixturevalue(which)
    rng = random.Random(0)
    vocab = len(tok)
    byte_ids = list(range(3, 259)) if which == "fallback_tok" else list(range(vocab))
    for trial in range(300):
        pool = byte_ids if trial % 2 else range(vocab)  # half the trials mostly byte tokens
        ids = [rng.choice(pool) for _ in range(rng.randint(1, 40))]
        check_stream(tok, ids, stream(tok, ids, rng))


@pytest.mark.parametrize("which", ["smol_tok", "fallback_tok"])
def test_valid_text_never_streams_a_broken_character(which, request):
    tok = request.getfixturevalue(which)
    rng = random.Random(1)
    for text in TRICKY:
        ids = tok.encode(text, add_special_tokens=False)
        for grouped in (None, rng):
            pieces = stream(tok, ids, grouped)
            check_stream(tok, ids, pieces)
            assert not any("\ufffd" in p for p in pieces), (text, pieces)
        if which == "smol_tok":
            assert "".join(pieces) == text  # byte-level BPE round-trips any string


def test_decoding_tokens_one_by_one_is_what_goes_wrong(smol_tok):
    """The naive approach, for contrast: an emoji spread over several tokens comes out broken."""
    ids = smol_tok.encode("🤖", add_special_tokens=False)
    assert len(ids) > 1
    assert "\ufffd" in "".join(smol_tok.decode([i]) for i in ids)
    assert "".join(stream(smol_tok, ids)) == "🤖"


def test_special_tokens_are_skipped(smol_tok):
    ids = smol_tok.encode("Hi there", add_special_tokens=False) + [smol_tok.eos_token_id]
    pieces = stream(smol_tok, ids)
    assert "".join(pieces) == "Hi there" and pieces[-2:] == ["", ""]


# ---- stop strings ---------------------------------------------------------------------------


def naive_stop(text: str, stops: List[str]) -> tuple[str, bool]:
    hits = [text.find(s) for s in stops if s in text]
    return (text[: min(hits)], True) if hits else (text, False)


def test_stop_strings_cut_at_the_first_match_however_the_text_is_split():
    rng = random.Random(2)
    for _ in range(2000):
        text = "".join(rng.choice("abc\n") for _ in range(rng.randint(0, 30)))
        stops = ["".join(rng.choice("abc\n") for _ in range(rng.randint(1, 4))) for _ in range(rng.randint(0, 3))]
        f = StopStringFilter(stops)
        out, stopped, i = "", False, 0
        while i < len(text) and not stopped:
            n = rng.randint(1, 5)
            piece, stopped = f.push(text[i : i + n])
            out += piece
            i += n
        if not stopped:
            out += f.flush()
        assert (out, stopped) == naive_stop(text, stops), (text, stops)


# ---- the worker, with the sockets replaced by lists --------------------------------------------


class ListQueue(list):
    def put(self, msg) -> None:
        self.append(msg)


@pytest.fixture()
def worker(smol_tok):
    return TokenizerWorker(smol_tok, max_seq_len=64, to_scheduler=ListQueue(), to_api=ListQueue())


def test_worker_applies_the_chat_template_and_fills_max_tokens(worker, smol_tok):
    chat = [{"role": "user", "content": "What is 2+2?"}]
    worker.on_api_msg(TokenizeMsg(1, chat, True, SamplingParams(max_tokens=1), max_tokens_from_context=True))
    (msg,) = worker.to_scheduler
    expected = smol_tok.apply_chat_template(chat, add_generation_prompt=True, tokenize=True, return_dict=False)
    assert isinstance(msg, UserMsg) and msg.input_ids.tolist() == list(expected) and msg.input_ids.dtype == torch.int32
    assert msg.sampling_params.max_tokens == 64 - len(expected)  # the room left in the context
    assert TokenizeManager(smol_tok).encode("The capital", chat=False) == smol_tok.encode("The capital", add_special_tokens=False)


def test_worker_refuses_a_prompt_longer_than_the_context(worker):
    worker.on_api_msg(TokenizeMsg(2, list(range(100, 170)), False, SamplingParams()))
    (reply,) = worker.to_api
    assert isinstance(reply, ErrorReply) and reply.status == 400
    assert "70 tokens" in reply.message and "64 tokens" in reply.message
    assert not worker.to_scheduler and not worker.streams


def test_worker_streams_text_and_cuts_at_a_stop_string(worker, smol_tok):
    worker.on_api_msg(TokenizeMsg(3, "x", False, SamplingParams(max_tokens=30), stop=["STOP"]))
    ids = smol_tok.encode(" Paris is nice. STOP here", add_special_tokens=False)
    replies = [r for t in ids for r in worker.on_scheduler_msg(DetokenizeMsg(3, t))]
    assert "".join(r.text for r in replies) == " Paris is nice. "
    assert replies[-1].finished and replies[-1].finish_reason == "stop"
    assert worker.to_scheduler[-1] == AbortMsg(3)  # the scheduler cannot see text: it is told
    assert sum(len(r.token_ids) for r in replies) == replies[-1].completion_tokens
    assert worker.on_scheduler_msg(DetokenizeMsg(3, None, "abort")) == []  # late words are dropped


def test_worker_flushes_on_finish_and_forgets_aborted_requests(worker, smol_tok):
    worker.on_api_msg(TokenizeMsg(4, "x", False, SamplingParams()))
    worker.on_api_msg(TokenizeMsg(5, "y", False, SamplingParams()))
    emoji = smol_tok.encode("🤖", add_special_tokens=False)
    assert worker.on_scheduler_msg(DetokenizeMsg(4, emoji[0])) == []  # half a character: wait
    (last,) = worker.on_scheduler_msg(DetokenizeMsg(4, emoji[1], "length")) if len(emoji) == 2 else [None]
    assert last is None or (last.text == "🤖" and last.finished and last.finish_reason == "length")
    worker.on_api_msg(AbortMsg(5))
    assert worker.to_scheduler[-1] == AbortMsg(5) and 5 not in worker.streams
    assert worker.on_scheduler_msg(DetokenizeMsg(5, 7)) == []
    assert worker.on_scheduler_msg(SchedulerErrorMsg(6, "too big")) == [ErrorReply(6, 400, "too big")]
    assert isinstance(UserReply(1, ""), UserReply)


def test_a_chat_without_a_chat_template_is_refused_with_what_to_do_instead():
    manager = TokenizeManager(placeholder_tokenizer(50))
    with pytest.raises(InvalidRequestError, match="no chat template.*plain prompt"):
        manager.encode([{"role": "user", "content": "hi"}], chat=True)
    assert manager.encode("<7><42>", chat=False) == [7, 42]  # a plain prompt still goes through
    for text in ["hello", "<7> <42>", "<7>x"]:  # text the stand-in cannot read is refused, not read as <0>
        with pytest.raises(InvalidRequestError, match="token ids written as '<5><17>'"):
            manager.encode(text, chat=False)


def test_the_placeholder_tokenizer_reads_token_i_as_angle_i():
    tok = placeholder_tokenizer(1000)
    assert len(tok) == 1000
    assert tok.decode([5, 17, 999]) == "<5><17><999>"
    assert stream(tok, [5, 17, 999, 3]) == ["<5>", "<17>", "<999>", "<3>", ""]  # each token streams as it comes
