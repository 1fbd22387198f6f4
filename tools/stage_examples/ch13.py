"""Chapter 13: streaming detokenization gives the same text as decoding all at once."""

from transformers import AutoTokenizer

from minisgl.tokenizer import IncrementalDetokenizer

tok = AutoTokenizer.from_pretrained("models/smollm2-135m-instruct")
ids = tok.encode("Grüße aus Zürich! 東京 🙂 and code: def f(x): return x")
detok = IncrementalDetokenizer(tok)
text = "".join(detok.add([i]) for i in ids) + detok.flush()
assert text == tok.decode(ids, skip_special_tokens=True), (text, tok.decode(ids))
print(repr(text))
