"""Chapter 22, the map of what minisgl has and lacks beside SGLang and vLLM (`chapters/gap.py`).

Claims: every mark of minisgl's is backed by the engine (each piece a row names exists: a symbol,
a config or request field, a command-line flag, an API route, a line of source) and every "no" or
"partly" names what is missing (a field or symbol that does not exist, or words that no source
file of the package contains); each kind of probe can fail (a
missing piece reads as missing); and the four features the map once wrongly called missing work:
`n > 1` choices are accepted by the API's request bodies, `/metrics` serves Prometheus text, the
server drains on shutdown, and xgrammar's compiled grammars are cached.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "chapters"))
import gap  # noqa: E402


@pytest.mark.parametrize("feature", gap.FEATURES, ids=lambda f: f.name)
def test_each_mark_agrees_with_the_engine(feature):
    for p in feature.has:
        assert gap.probe(p), f"{feature.name} is marked {feature.minisgl!r}, but {p} is not in the engine"
    for entry in feature.lacks:
        if entry.split(":", 1)[0] in ("sym", "field", "flag", "route", "src"):
            assert not gap.probe(entry), f"{feature.name} is marked {feature.minisgl!r}, but {entry} is in the engine"
        else:
            assert not gap.mentions(entry), f"{feature.name} is marked {feature.minisgl!r}, but {entry!r} appears in {gap.mentions(entry)}"
    assert gap.disagreements([feature]) == []


def test_the_map_covers_the_chapter_rows_once():
    names = [f.name for f in gap.FEATURES]
    assert len(names) == len(set(names))
    assert {f.minisgl for f in gap.FEATURES} == {"yes", "partly", "no"}


@pytest.mark.parametrize("p", [
    "sym:minisgl.scheduler.prefill:no_such_policy",
    "sym:minisgl.no_such_module:Thing",
    "field:minisgl.core:SamplingParams.no_such_field",
    "field:minisgl.server.protocol:_Common.no_such_field",
    "flag:--no-such-flag",
    "route:/no-such-route",
    "src:minisgl.engine.grammar:GrammarManager.fill:no such text in this method",
])
def test_a_missing_piece_reads_as_missing(p):
    assert not gap.probe(p)


def test_probes_find_what_is_there_and_refuse_unknown_kinds():
    assert gap.probe("field:minisgl.engine:EngineConfig.tp_size")  # a dataclass field
    assert gap.probe("field:minisgl.server.protocol:_Common.n")  # a pydantic field
    assert gap.mentions("def longest_prefix_first") == ["minisgl/scheduler/prefix.py"]
    with pytest.raises(ValueError, match="unknown probe kind"):
        gap.probe("file:minisgl/core.py")


def test_a_feature_mark_must_come_with_evidence():
    with pytest.raises(AssertionError):
        gap.Feature("x", "yes", "yes", "yes")  # "yes" with nothing that backs it
    with pytest.raises(AssertionError):
        gap.Feature("x", "partly", "yes", "yes", has=("flag:--tp-size",))  # "partly" without what is missing
    bogus = gap.Feature("x", "partly", "yes", "yes", has=("flag:--no-such-flag",), lacks=("def ", "flag:--tp-size"))
    assert len(gap.disagreements([bogus])) == 3


def test_n_choices_are_accepted_and_bounded():
    from minisgl.server.protocol import MAX_CHOICES, CompletionRequest

    assert CompletionRequest(model="m", prompt="Hi", n=3).n == 3
    with pytest.raises(ValueError):
        CompletionRequest(model="m", prompt=["a", "b"], n=MAX_CHOICES)


def test_metrics_render_prometheus_text():
    from minisgl.server.metrics import Metrics

    m = Metrics()
    m.requests.labels("/metrics", "200").inc()
    text = m.render().decode()
    assert "# TYPE minisgl_requests_total counter" in text
    assert 'minisgl_requests_total{code="200",route="/metrics"} 1.0' in text


def test_draining_server_and_grammar_cache():
    import inspect

    import uvicorn

    from minisgl.engine.grammar import GrammarManager
    from minisgl.server.drain import DrainingServer

    assert issubclass(DrainingServer, uvicorn.Server)
    assert "cache_enabled=True" in inspect.getsource(GrammarManager._get_compiler)
