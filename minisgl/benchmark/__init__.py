"""Benchmarks: offline throughput (`offline`), time per output token (`decode`), the Hugging Face
`generate` baseline (`hf_baseline`), the serving load generator (`online`), one MoE layer,
fused kernel against the PyTorch path (`moe`), prefill and a chat batch on the CPU against
transformers (`cpu`), and decode steps with overlap scheduling off and
on (`overlap`). Each runs as `python -m minisgl.benchmark.<name>`."""
