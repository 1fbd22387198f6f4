"""Chapter 15: admission on a server. A short chat is not held behind requests whose `max_tokens`
need more KV pages than are free: it is admitted past them and answered while a long stream
still runs, in a small fraction of that stream's time (a ratio measured in the same run).

One tiny-llama server with a pool of 2400 pages (of one token): a 1900-token stream holds most
of it, so a request that asks for 2000 tokens fits alone, but not beside the stream.
"""

from __future__ import annotations

import asyncio
import time

import httpx

from server_utils import assert_all_free, server_fixture

TINY = "models/tiny-llama"
server = server_fixture(TINY, "--num-pages", "2400")

PROMPT = "Tell me everything."
STREAM = {"model": "tiny-llama", "prompt": PROMPT, "max_tokens": 1900, "ignore_eos": True, "temperature": 0, "stream": True}
LARGE = {"model": "tiny-llama", "prompt": PROMPT, "max_tokens": 2000, "ignore_eos": True, "temperature": 0}
CHAT = {"model": "tiny-llama", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 12, "temperature": 0}


async def _waiting(client: httpx.AsyncClient, url: str, n: int) -> None:
    while (await client.get(url + "/health")).json().get("waiting_requests") != n:
        await asyncio.sleep(0.05)


async def _short_chat_beside_large_ones(url: str) -> tuple:
    """(the stream's seconds, the chat's seconds, the chat's reply, whether the stream was still
    running when the chat was answered)."""
    async with httpx.AsyncClient(timeout=300) as client:
        first, done = asyncio.Event(), asyncio.Event()

        async def stream() -> float:
            t0 = time.monotonic()
            async with client.stream("POST", url + "/v1/completions", json=STREAM) as r:
                async for _ in r.aiter_lines():
                    first.set()
            done.set()
            return time.monotonic() - t0

        streaming = asyncio.ensure_future(stream())
        await asyncio.wait_for(first.wait(), 60)
        large = [asyncio.ensure_future(client.post(url + "/v1/completions", json=LARGE)) for _ in range(2)]
        await asyncio.wait_for(_waiting(client, url, 2), 30)  # both queued, neither fits beside the stream
        t0 = time.monotonic()
        chat = await client.post(url + "/v1/chat/completions", json=CHAT)
        chat_s, stream_running = time.monotonic() - t0, not done.is_set()
        stream_s = await streaming
        for task in large:  # their clients hang up: the server aborts them
            task.cancel()
        await asyncio.gather(*large, return_exceptions=True)
        return stream_s, chat_s, chat, stream_running


def test_a_short_chat_is_not_held_behind_requests_that_do_not_fit(server):
    stream_s, chat_s, chat, stream_running = asyncio.run(_short_chat_beside_large_ones(server.url))
    assert chat.status_code == 200, chat.text
    assert chat.json()["usage"]["completion_tokens"] == CHAT["max_tokens"]
    assert stream_running, "the chat was answered only after the stream ended"
    assert chat_s < stream_s / 4, f"the chat took {chat_s:.2f} s beside a stream of {stream_s:.2f} s"
    assert_all_free(server)
