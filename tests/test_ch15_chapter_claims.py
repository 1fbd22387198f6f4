"""Chapter 15's claims about the server, checked against the engine: the endpoints its summary
lists are exactly the app's routes, the flags it names exist, and the limits its prose states are
the ones the code enforces. No server is started: the app is built without a backend."""

from __future__ import annotations

import json
import re
from pathlib import Path

from fastapi.routing import APIRoute

from minisgl.server.api import create_app
from minisgl.server.args import ServerArgs, build_parser
from minisgl.server.errors import MAX_DEPTH
from minisgl.server.protocol import QUOTE_CHARS

ROOT = Path(__file__).resolve().parent.parent
CHAPTER = ROOT / "chapters" / "15_api_server.ipynb"


def _cells(kind: str = "") -> list:
    return ["".join(c["source"]) for c in json.loads(CHAPTER.read_text())["cells"] if kind in ("", c["cell_type"])]


def _prose() -> str:
    return "\n".join(_cells("markdown"))


def _summary() -> str:
    (summary,) = [s for s in _cells() if s.startswith("## Summary")]
    return summary.split("### How to explain it")[0]


def _shape(path: str) -> str:
    return re.sub(r"\{[^}]*\}", "{}", path)  # /v1/models/{model_id:path} and /v1/models/{id} alike


def test_the_summary_lists_exactly_the_servers_endpoints():
    app = create_app(ServerArgs.from_options(model_path=str(ROOT / "models" / "tiny-llama")), None)
    routes = {_shape(r.path) for r in app.routes if isinstance(r, APIRoute)}
    listed = {_shape(p) for p in re.findall(r"`(/[^`\s]*)`", _summary())}
    assert listed == routes, f"listed but not served: {listed - routes}; served but not listed: {routes - listed}"


def test_the_flags_the_chapter_names_exist():
    flags = {s for a in build_parser()._actions for s in a.option_strings}
    named = set(re.findall(r"`(--[a-z-]+)`", _prose()))
    assert named and named <= flags, named - flags


def test_the_limits_the_prose_states_are_the_codes():
    prose = _prose()
    assert f"more than {MAX_DEPTH} levels deep" in prose
    assert f"up to {QUOTE_CHARS} characters" in prose
