"""`/metrics`: the server's counters in the Prometheus text format, through `prometheus-client`.

Two sources. The API process counts what it sees -- responses, tokens, and the latency of each
request (TTFT: submit to the first token; TPOT: the mean gap between later tokens). The scheduler
owns the rest (queue, running requests, KV pages, prefix-cache hits); `/metrics` asks it for a
fresh `StatusMsg` and reports that, or the last one when the scheduler is in a long step. Every
server gets its own registry, so two servers in one process (tests) never share a count.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator, List, Optional, Tuple

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from minisgl.message import StatusMsg

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
CLIENT_CLOSED = 499  # the client hung up before any answer (nginx's code for it)
# seconds: from a fast GPU step to a long prefill on the CPU
_TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class _SchedulerCollector(Collector):
    """Reports the scheduler's last `StatusMsg` at each scrape."""

    def __init__(self) -> None:
        self.status: Optional[StatusMsg] = None

    def collect(self) -> Iterator:
        st = self.status
        if st is None:
            return
        gauges = {
            "minisgl_queue_length": ("requests waiting to be admitted", st.waiting_requests),
            "minisgl_running_requests": ("requests admitted and not finished (prefill or decode)", st.running_requests),
            "minisgl_kv_pages_used": ("KV pages held by running requests",
                                      st.total_pages - st.free_pages - st.cached_pages),
            "minisgl_kv_pages_cached": ("KV pages held by the prefix cache (reusable, evictable)", st.cached_pages),
            "minisgl_kv_pages_total": ("KV pages in the pool", st.total_pages),
        }
        for name, (doc, value) in gauges.items():
            yield GaugeMetricFamily(name, doc, value=value)
        counters = {
            "minisgl_scheduler_prompt_tokens": ("prompt tokens of admitted requests", st.prompt_tokens),
            "minisgl_prefix_cache_hit_tokens": ("prompt tokens found in the prefix cache (not computed again)",
                                                st.prefix_hit_tokens),
            "minisgl_aborted_requests": ("requests aborted (client gone, stop string)", st.aborted_requests),
        }
        for name, (doc, value) in counters.items():
            yield CounterMetricFamily(name, doc, value=value)


class CountResponses:
    """ASGI middleware: count every response by route and status code. A plain ASGI wrapper that
    only watches `send`: Starlette's `@app.middleware("http")` runs the route behind a stream of
    its own, which hides the client's disconnect from the route, so a request whose client hung
    up would run to its end."""

    def __init__(self, app: Any, metrics: "Metrics", routes: Tuple[str, ...]):
        self.app = app
        self.metrics = metrics
        self.routes = routes

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        status: List[Optional[int]] = [None]

        async def watch(message: dict) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        # an app that raises before answering gets Starlette's 500; one that returns without an
        # answer saw its client hang up (mid-body, say): 499, as nginx logs it, never a 500
        unanswered = 500
        try:
            await self.app(scope, receive, watch)
            unanswered = CLIENT_CLOSED
        finally:
            path = scope["path"]
            route = path if path in self.routes else "/v1/models/{id}" if path.startswith("/v1/models/") else "other"
            code = status[0] if status[0] is not None else unanswered
            self.metrics.requests.labels(route, str(code)).inc()


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("minisgl_requests", "HTTP responses, by route and status code", ["route", "code"],
                                registry=r)
        self.prompt_tokens = Counter("minisgl_prompt_tokens", "prompt tokens of finished requests", registry=r)
        self.output_tokens = Counter("minisgl_generation_tokens", "tokens generated for finished requests", registry=r)
        self.ttft = Histogram("minisgl_time_to_first_token_seconds", "from submitting a request to its first token",
                              buckets=_TTFT_BUCKETS, registry=r)
        self.tpot = Histogram("minisgl_time_per_output_token_seconds",
                              "mean time per token after the first, per request", buckets=_TPOT_BUCKETS, registry=r)
        self.scheduler = _SchedulerCollector()
        r.register(self.scheduler)

    def observe_choice(self, prompt_tokens: int, output_tokens: int, ttft_s: Optional[float], total_s: float) -> None:
        """One finished choice; `ttft_s` is None when it produced no token."""
        self.prompt_tokens.inc(prompt_tokens)
        self.output_tokens.inc(output_tokens)
        if ttft_s is not None:
            self.ttft.observe(ttft_s)
            if output_tokens > 1:
                self.tpot.observe((total_s - ttft_s) / (output_tokens - 1))

    def render(self) -> bytes:
        return generate_latest(self.registry)
