"""Chapter 0's transformers reference (`book.transformers_reference`): what transformers' own model says,
computed in a child process, and a child that does not answer in time is stopped with a message."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from file_module import load_file

REPO = Path(__file__).resolve().parent.parent
MODEL = REPO / "models" / "tiny-qwen3"


@pytest.fixture(scope="module")
def book():
    return load_file(REPO / "chapters" / "book.py", "_book_for_reference_tests")


def test_the_reference_is_transformers_greedy_continuation_and_last_logits(book) -> None:
    from transformers import AutoModelForCausalLM

    prompt = [1, 5, 9, 30, 7]
    ref = book.transformers_reference([prompt], 6, path=MODEL, ignore_eos=True, last_logits=True)[0]
    model = AutoModelForCausalLM.from_pretrained(MODEL, dtype=torch.float32)
    with torch.no_grad():
        x = torch.tensor([prompt])
        want = model.generate(x, max_new_tokens=6, min_new_tokens=6, do_sample=False)[0, len(prompt):].tolist()
        logits = model(x).logits[0, -1]
    assert ref.tokens == want
    torch.testing.assert_close(ref.logits, logits)


def test_a_reference_that_does_not_answer_in_time_is_stopped_with_a_message(book, monkeypatch) -> None:
    monkeypatch.setattr(book, "REFERENCE_S", 0.01)  # no child starts Python that fast
    with pytest.raises(RuntimeError, match="did not finish within 0.01 s and was stopped"):
        book.transformers_reference([[1, 2, 3]], 2, path=MODEL)
