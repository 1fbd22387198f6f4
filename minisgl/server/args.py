"""Server options: one frozen dataclass, filled from the command line."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Optional

from minisgl.engine import EngineConfig
from minisgl.scheduler import SchedulerConfig
from minisgl.scheduler.config import check_schedule_policy
from minisgl.scheduler.prefill import SCHEDULE_POLICIES
from minisgl.utils import default_model_path


@dataclass(frozen=True)
class ServerArgs:
    model: str = field(default_factory=lambda: str(default_model_path()))
    served_model_name: Optional[str] = None  # default: the model folder's name
    tokenizer: Optional[str] = None  # default: the model folder
    dummy_weights: bool = False  # random weights from config.json (speed runs without a checkpoint)
    host: str = "127.0.0.1"
    port: int = 1919
    shell: bool = False
    shell_max_tokens: Optional[int] = None  # per shell reply; None: up to the context length
    device: str = "auto"
    tp_size: int = 1  # tensor-parallel ranks: the scheduler process leads tp_size - 1 more
    dtype: str = "auto"
    page_size: int = 1
    max_running_reqs: int = 256
    max_seq_len: Optional[int] = None
    num_pages: Optional[int] = None
    memory_fraction: float = 0.9
    cpu_kv_budget_gb: float = 1.0
    attention_backend: str = "auto"
    cuda_graph: bool = True
    prefix_cache: str = "radix"
    max_extend_tokens: Optional[int] = None  # default: suited to the device (SchedulerConfig)
    schedule_policy: str = "fcfs"
    overlap: bool = True
    seed: int = 0
    log_level: str = "warning"
    max_request_bytes: int = 2 * 1024 * 1024  # a body over this is refused (413) before parsing
    drain_timeout_s: float = 30.0  # on SIGTERM: how long in-flight requests may still run

    def __post_init__(self) -> None:
        if not 0 < self.port < 65536:
            raise ValueError(f"port must be in 1..65535, got {self.port}")
        if self.tp_size < 1:
            raise ValueError(f"--tp-size must be at least 1, got {self.tp_size}")
        if self.max_request_bytes < 1024:
            raise ValueError(f"--max-request-bytes must be at least 1024, got {self.max_request_bytes}")
        if self.drain_timeout_s < 0:
            raise ValueError(f"--drain-timeout must be >= 0 seconds, got {self.drain_timeout_s}")
        check_schedule_policy(self.schedule_policy, self.prefix_cache)

    @property
    def model_name(self) -> str:
        return self.served_model_name or Path(self.model).resolve().name

    @property
    def tokenizer_path(self) -> str:
        return self.tokenizer or self.model

    def scheduler_config(self) -> SchedulerConfig:
        engine = EngineConfig(
            model_path=self.model,
            device=self.device,
            dtype=self.dtype,
            page_size=self.page_size,
            max_running_reqs=self.max_running_reqs,
            max_seq_len=self.max_seq_len,
            num_pages=self.num_pages,
            memory_fraction=self.memory_fraction,
            cpu_kv_budget_gb=self.cpu_kv_budget_gb,
            attention_backend=self.attention_backend,
            use_cuda_graph=self.cuda_graph,
            dummy_weights=self.dummy_weights,
            seed=self.seed,
            tp_size=self.tp_size,
        )
        return SchedulerConfig(engine=engine, prefix_cache=self.prefix_cache, max_extend_tokens=self.max_extend_tokens,
                               schedule_policy=self.schedule_policy, overlap=self.overlap)


def build_parser() -> argparse.ArgumentParser:
    d = ServerArgs.__dataclass_fields__
    p = argparse.ArgumentParser(prog="python -m minisgl", description="Serve a model with an OpenAI-compatible API, or chat with it in the terminal (--shell).")
    p.add_argument("--model", default=None, help="model directory (Hugging Face layout); default: the bundled SmolLM2-135M-Instruct")
    p.add_argument("--served-model-name", default=None, help="name clients use in the 'model' field; default: the model folder's name")
    p.add_argument("--tokenizer", default=None, help="tokenizer directory; default: the model directory")
    p.add_argument("--dummy-weights", action="store_true", help="random weights from the model's config.json (for speed runs; the text is noise)")
    p.add_argument("--host", default=d["host"].default, help="address to listen on")
    p.add_argument("--port", type=int, default=d["port"].default, help="port to listen on")
    p.add_argument("--shell", action="store_true", help="chat in the terminal instead of serving HTTP")
    p.add_argument("--shell-max-tokens", type=int, default=None, help="most tokens per reply in the shell; default: up to the context length")
    p.add_argument("--device", default="auto", help="auto (CUDA if present, else CPU), cpu, cuda or cuda:N")
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"], help="weight and activation dtype; auto: bfloat16 on CUDA, float32 on the CPU")
    p.add_argument("--tp-size", type=int, default=1, help="tensor-parallel ranks, one process (and GPU) each; the model's heads must split evenly")
    p.add_argument("--page-size", type=int, default=1, help="tokens per KV page (a power of two)")
    p.add_argument("--max-running-reqs", type=int, default=256, help="most requests decoding at once (rows of the page table)")
    p.add_argument("--max-seq-len", type=int, default=None, help="context length cap; default: the model's")
    p.add_argument("--num-pages", type=int, default=None, help="KV pool size in pages; default: sized from memory")
    p.add_argument("--memory-fraction", type=float, default=0.9, help="share of free GPU memory (after weights) for the KV pool")
    p.add_argument("--cpu-kv-budget-gb", type=float, default=1.0, help="KV pool size on the CPU, in GiB")
    p.add_argument("--attention-backend", default="auto", help="auto, torch or flashinfer")
    p.add_argument("--disable-cuda-graph", action="store_true", help="run decode steps eagerly instead of replaying CUDA graphs")
    p.add_argument("--prefix-cache", default="radix", choices=["radix", "naive"], help="radix reuses shared prompt prefixes; naive reuses nothing")
    p.add_argument("--max-extend-tokens", type=int, default=None, help="prefill token budget per step; longer prompts are chunked; default: 8192 on a GPU, 256 on the CPU")
    p.add_argument("--schedule-policy", default="fcfs", choices=list(SCHEDULE_POLICIES), help="order waiting requests by arrival (fcfs) or longest cached prefix first (lpm, needs the radix cache)")
    p.add_argument("--disable-overlap", action="store_true", help="do not plan step N+1 while step N runs")
    p.add_argument("--seed", type=int, default=0, help="seed for requests that give none")
    p.add_argument("--max-request-bytes", type=int, default=d["max_request_bytes"].default, help="largest request body accepted, in bytes; a larger one gets 413")
    p.add_argument("--drain-timeout", type=float, default=d["drain_timeout_s"].default, help="seconds in-flight requests may still run after SIGTERM or Ctrl-C; the rest then end with an error")
    p.add_argument("--log-level", default="warning", choices=["debug", "info", "warning", "error"], help="log verbosity of the server")
    return p


def parse_args(argv: Optional[List[str]] = None) -> ServerArgs:
    parser = build_parser()
    ns = parser.parse_args(argv)
    try:
        return _from_namespace(ns)
    except ValueError as e:
        parser.error(str(e))  # usage and the message, exit status 2


def _from_namespace(ns: argparse.Namespace) -> ServerArgs:
    return ServerArgs(
        model=ns.model or str(default_model_path()),
        served_model_name=ns.served_model_name,
        tokenizer=ns.tokenizer,
        dummy_weights=ns.dummy_weights,
        host=ns.host,
        port=ns.port,
        shell=ns.shell,
        shell_max_tokens=ns.shell_max_tokens,
        device=ns.device,
        tp_size=ns.tp_size,
        dtype=ns.dtype,
        page_size=ns.page_size,
        max_running_reqs=ns.max_running_reqs,
        max_seq_len=ns.max_seq_len,
        num_pages=ns.num_pages,
        memory_fraction=ns.memory_fraction,
        cpu_kv_budget_gb=ns.cpu_kv_budget_gb,
        attention_backend=ns.attention_backend,
        cuda_graph=not ns.disable_cuda_graph,
        prefix_cache=ns.prefix_cache,
        max_extend_tokens=ns.max_extend_tokens,
        schedule_policy=ns.schedule_policy,
        overlap=not ns.disable_overlap,
        seed=ns.seed,
        log_level=ns.log_level,
        max_request_bytes=ns.max_request_bytes,
        drain_timeout_s=ns.drain_timeout,
    )
