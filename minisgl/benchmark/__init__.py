"""Benchmarks: offline throughput (`offline`), time per output token (`decode`), and the
Hugging Face `generate` baseline (`hf_baseline`). Each runs as `python -m minisgl.benchmark.<name>`."""
