"""Serving HTTP until told to stop (`serve`), and a graceful stop: uvicorn's server with a drain
before its shutdown.

On the first SIGTERM (or Ctrl-C) the server stops accepting connections and answers new requests
on open ones with a 503; requests already running get `drain_s` seconds to finish; whatever is
still open then ends with a 503 error object (a streaming client gets it as its last event); only
then does uvicorn shut down. A second Ctrl-C quits at once.
"""

from __future__ import annotations

import asyncio
import signal
import time
from typing import Any

import uvicorn

from .api import create_app
from .args import ServerArgs
from .frontend import FrontendManager, Lifecycle
from .launch import Backend, LaunchError, say


ANSWER_S = 10.0  # the most a drain waits, after the drain time, for the failed requests' handlers to answer


class DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, lifecycle: Lifecycle, frontend: FrontendManager, drain_s: float):
        super().__init__(config)
        self.lifecycle = lifecycle
        self.frontend = frontend
        self.drain_s = drain_s
        self._drain_task: "asyncio.Future[None] | None" = None

    def stop_now(self) -> None:
        self.should_exit = True

    def handle_exit(self, sig: int, frame: Any) -> None:
        if self.lifecycle.draining or self.lifecycle.dead:
            return super().handle_exit(sig, frame)
        self._captured_signals.append(sig)  # uvicorn re-raises it after the shutdown
        self.lifecycle.draining = True
        # a signal handler runs between two steps of the event loop, on its thread
        self._drain_task = asyncio.ensure_future(self._drain())

    async def _drain(self) -> None:
        for listener in getattr(self, "servers", []):
            listener.close()  # no new connections
        deadline = time.monotonic() + self.drain_s
        while self.frontend.open and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        if self.frontend.fail_all(503, "the server shut down before this request finished (drain time "
                                       f"{self.drain_s:g} s)"):
            # each handler reaches its error after the tokens already queued for it: wait until every one
            # has, so no client's stream ends without saying why (bounded: a handler may be stuck sending)
            answered_by = time.monotonic() + ANSWER_S
            while self.frontend.open and time.monotonic() < answered_by:
                await asyncio.sleep(0.05)
        self.should_exit = True


def serve(args: ServerArgs) -> None:
    """Run the HTTP server until Ctrl-C or SIGTERM (exit status 0, after draining), or until a
    process of the engine dies (exit status 1). It listens while the engine starts (`/health`
    says "starting"); a start-up that fails raises LaunchError once the server has closed."""
    backend = Backend(args, report=lambda what: say(f"waiting for {what}"))
    app = create_app(args, backend)
    host, port = args.server.host, args.server.port
    config = uvicorn.Config(app, host=host, port=port, log_level=args.server.log_level, timeout_graceful_shutdown=3)
    server = DrainingServer(config, app.state.lifecycle, app.state.frontend, args.server.drain_timeout_s)
    lifecycle: Lifecycle = app.state.lifecycle
    lifecycle.stop_serving = server.stop_now
    lifecycle.on_ready = lambda: print(f"minisgl: serving {args.model_name} on http://{host}:{port} (device "
                                       f"{backend.info['device']})", flush=True)
    print(f"minisgl: starting {args.model_name} on http://{host}:{port} (/health says \"starting\" until the "
          "engine is ready)", flush=True)
    # uvicorn shuts down gracefully on SIGINT / SIGTERM, then re-raises the signal with the
    # handlers it found installed; these turn that into a normal return, so the engine's
    # processes are stopped and we exit with status 0
    previous = signal.signal(signal.SIGTERM, _raise_shutdown)
    try:
        server.run()
    except (KeyboardInterrupt, _Shutdown):
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
        backend.stop()  # the app's shutdown stopped them already, unless uvicorn never started it
    if lifecycle.failed:
        raise LaunchError(lifecycle.failed)
    if lifecycle.dead:
        print(f"minisgl: the engine is gone ({lifecycle.dead}); exiting", flush=True)
        raise SystemExit(1)
    print("minisgl: stopped", flush=True)


class _Shutdown(Exception):
    pass


def _raise_shutdown(signum: int, frame: Any) -> None:
    raise _Shutdown()
