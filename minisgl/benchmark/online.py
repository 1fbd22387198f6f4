"""Online latency: a client that streams requests to a running server, `concurrency` at a time.

For each request it records TTFT (time to the first text), TPOT (the time per output token after
the first) and E2E (the whole request); it reports their percentiles and the output throughput.
The workload is the offline benchmark's (random token-id prompts, random lengths, EOS ignored),
sent as `/v1/completions` with token ids, so no tokenizer runs on the client.

    python -m minisgl --model models/tiny-llama --port 1919 &        # a server
    python -m minisgl.benchmark.online --url http://127.0.0.1:1919 --num-requests 32 --concurrency 8 \\
        --input-len 16 64 --output-len 8 32                           # seconds on a CPU

`--stall-probe N` measures instead what one long prompt costs a short request: it sends an
N-token prompt, and while that is being prefilled a chat whose answer is 2 tokens; it prints the
chat's TTFT and end-to-end time next to the long prompt's TTFT (chapter 10's scheduling rule is
what keeps the first two small).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from dataclasses import asdict, dataclass
from typing import Dict, List, Optional, Sequence

import httpx
import numpy as np

from minisgl.benchmark.offline import make_workload


@dataclass
class RequestTiming:
    ttft_s: float
    e2e_s: float
    output_tokens: int

    @property
    def tpot_s(self) -> Optional[float]:
        """Mean time per token after the first; undefined for a one-token answer."""
        return (self.e2e_s - self.ttft_s) / (self.output_tokens - 1) if self.output_tokens > 1 else None


@dataclass
class OnlineReport:
    num_requests: int
    concurrency: int
    wall_s: float
    input_tokens: int
    output_tokens: int
    output_throughput: float  # output tokens / s over the whole run
    ttft_ms: Dict[str, float]
    tpot_ms: Dict[str, float]
    e2e_ms: Dict[str, float]

    def table(self) -> str:
        rows = [
            f"requests {self.num_requests} at concurrency {self.concurrency}: {self.wall_s:.2f} s, "
            f"{self.input_tokens} prompt and {self.output_tokens} output tokens",
            f"output throughput: {self.output_throughput:.1f} tok/s",
            f"{'ms':<6}" + "".join(f"{k:>10}" for k in self.ttft_ms),
        ]
        for name, stats in (("TTFT", self.ttft_ms), ("TPOT", self.tpot_ms), ("E2E", self.e2e_ms)):
            rows.append(f"{name:<6}" + "".join(f"{v:>10.1f}" for v in stats.values()))
        return "\n".join(rows)


def percentiles(values_s: Sequence[float]) -> Dict[str, float]:
    a = np.asarray(values_s, dtype=np.float64) * 1000
    if a.size == 0:
        return {k: float("nan") for k in ("mean", "p50", "p90", "p99", "max")}
    return {"mean": float(a.mean()), "p50": float(np.percentile(a, 50)), "p90": float(np.percentile(a, 90)),
            "p99": float(np.percentile(a, 99)), "max": float(a.max())}


async def one_request(client: httpx.AsyncClient, url: str, model: str, prompt: List[int] | str,
                      max_tokens: int) -> RequestTiming:
    """One streamed request: a completion of token ids, or (a str prompt) a one-turn chat."""
    chat = isinstance(prompt, str)
    body = {
        "model": model,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
        **({"messages": [{"role": "user", "content": prompt}]} if chat else {"prompt": prompt}),
    }
    start = time.perf_counter()
    ttft, tokens = None, 0
    async with client.stream("POST", url + ("/v1/chat/completions" if chat else "/v1/completions"), json=body) as resp:
        if resp.status_code != 200:
            raise RuntimeError(f"server answered {resp.status_code}: {(await resp.aread()).decode()}")
        async for line in resp.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            first = chunk["choices"][0] if chunk["choices"] else None
            if ttft is None and first and (first["delta"].get("content") if chat else first["text"]):
                ttft = time.perf_counter() - start
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
    e2e = time.perf_counter() - start
    return RequestTiming(ttft if ttft is not None else e2e, e2e, tokens)


class ServerNotReady(RuntimeError):
    """The server did not answer /health with 200 in time."""


def _waiting_for(r: httpx.Response) -> str:
    """What a server that is not ready says it waits for (minisgl's 503 names it; anything else, its status)."""
    try:
        return str(r.json()["waiting_for"]) if r.status_code == 503 else f"HTTP {r.status_code}"
    except (ValueError, KeyError, TypeError):  # a 503 that is not minisgl's (a proxy's error page)
        return f"HTTP {r.status_code}"


async def wait_until_ready(client: httpx.AsyncClient, url: str, timeout_s: float = 600.0, poll_s: float = 1.0) -> None:
    """Wait until `/health` answers 200: a server that is still starting (503, what it waits for)
    or not yet listening is waited for, saying so once, so no timing includes its start-up."""
    deadline, said = time.monotonic() + timeout_s, None
    while True:
        try:
            r = await client.get(url + "/health")
            if r.status_code == 200:
                return
            what = _waiting_for(r)
        except httpx.TransportError as e:
            what = f"the server to listen ({type(e).__name__})"
        if what != said:
            print(f"waiting for {what}", flush=True)
            said = what
        if time.monotonic() > deadline:
            raise ServerNotReady(f"{url} was not ready within {timeout_s:.0f} s (last: waiting for {what}); is "
                                 "`python -m minisgl` running there?")
        await asyncio.sleep(poll_s)


async def run(url: str, prompts: List[List[int]], max_tokens: List[int], concurrency: int,
              model: Optional[str] = None) -> OnlineReport:
    limits = httpx.Limits(max_connections=concurrency + 4)
    async with httpx.AsyncClient(timeout=None, limits=limits) as client:
        await wait_until_ready(client, url)
        if model is None:
            model = (await client.get(url + "/v1/models")).json()["data"][0]["id"]
        gate = asyncio.Semaphore(concurrency)

        async def gated(p: List[int], m: int) -> RequestTiming:
            async with gate:
                return await one_request(client, url, model, p, m)

        await one_request(client, url, model, prompts[0][:8], 2)  # warm-up: connection, first step
        start = time.perf_counter()
        timings = await asyncio.gather(*(gated(p, m) for p, m in zip(prompts, max_tokens)))
        wall = time.perf_counter() - start
    out = sum(t.output_tokens for t in timings)
    return OnlineReport(
        num_requests=len(prompts),
        concurrency=concurrency,
        wall_s=wall,
        input_tokens=sum(len(p) for p in prompts),
        output_tokens=out,
        output_throughput=out / wall,
        ttft_ms=percentiles([t.ttft_s for t in timings]),
        tpot_ms=percentiles([t.tpot_s for t in timings if t.tpot_s is not None]),
        e2e_ms=percentiles([t.e2e_s for t in timings]),
    )


async def stall_probe(url: str, long_len: int, delay_s: float, seed: int, model: Optional[str] = None) -> Dict[str,
                                                                                                               float]:
    """A chat with a 2-token answer, sent `delay_s` after a `long_len`-token prompt (whose prefill
    it lands in): its TTFT and E2E, and the long prompt's TTFT, in milliseconds."""
    long_prompt = np.random.default_rng(seed).integers(100, 10000, long_len).tolist()
    async with httpx.AsyncClient(timeout=None) as client:
        await wait_until_ready(client, url)
        if model is None:
            model = (await client.get(url + "/v1/models")).json()["data"][0]["id"]
        await one_request(client, url, model, long_prompt[:8], 2)  # warm-up: connection, first step
        await one_request(client, url, model, "Hi!", 2)
        long = asyncio.ensure_future(one_request(client, url, model, long_prompt, 1))
        await asyncio.sleep(delay_s)
        short = await one_request(client, url, model, "Hi!", 2)
        long_t = await long
    return {"long_prompt_tokens": long_len, "long_ttft_ms": long_t.ttft_s * 1e3, "chat_ttft_ms": short.ttft_s * 1e3,
            "chat_e2e_ms": short.e2e_s * 1e3}


def main(argv: Optional[List[str]] = None) -> Optional[OnlineReport]:
    p = argparse.ArgumentParser(prog="python -m minisgl.benchmark.online",
                                description="TTFT / TPOT / E2E and throughput against a running minisgl server")
    p.add_argument("--url", default="http://127.0.0.1:1919", help="base URL of the server")
    p.add_argument("--model", default=None, help="model name to send; default: the first one /v1/models lists")
    p.add_argument("--num-requests", type=int, default=256, help="requests in the run")
    p.add_argument("--concurrency", type=int, default=64, help="most requests in flight at once")
    p.add_argument("--input-len", type=int, nargs=2, default=(100, 1024), metavar=("MIN", "MAX"),
                   help="prompt length range, in tokens")
    p.add_argument("--output-len", type=int, nargs=2, default=(100, 1024), metavar=("MIN", "MAX"),
                   help="output length range, in tokens")
    p.add_argument("--seed", type=int, default=0, help="workload seed")
    p.add_argument("--json-out", default=None, help="also write the report as JSON to this file")
    p.add_argument("--stall-probe", type=int, default=None, metavar="N",
                   help="instead of the workload: a chat with a 2-token answer sent while an N-token prompt is "
                        "prefilled; print its TTFT")
    p.add_argument("--probe-delay", type=float, default=0.5,
                   help="seconds between the long prompt and the chat, with --stall-probe")
    a = p.parse_args(argv)
    if a.stall_probe is not None:
        figures = asyncio.run(stall_probe(a.url.rstrip("/"), a.stall_probe, a.probe_delay, a.seed, a.model))
        print("  ".join(f"{k} {v:.0f}" for k, v in figures.items()), flush=True)
        return None
    w = make_workload(a.num_requests, a.input_len[0], a.input_len[1], a.output_len[0], a.output_len[1], a.seed)
    report = asyncio.run(run(a.url.rstrip("/"), w.prompts, w.max_tokens, a.concurrency, a.model))
    print(report.table(), flush=True)
    if a.json_out:
        with open(a.json_out, "w") as f:
            json.dump(asdict(report), f, indent=2)
    return report


if __name__ == "__main__":
    main()
