"""Chapter 21: the offline workload is the published one (same totals as nano-vllm's)."""

from minisgl.benchmark.offline import make_workload

w = make_workload()
assert len(w.prompts) == 256
assert (w.input_tokens, w.output_tokens) == (142827, 133966), (w.input_tokens, w.output_tokens)
print(w.input_tokens, "input tokens,", w.output_tokens, "output tokens")
