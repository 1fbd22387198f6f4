"""Chapter 13, request fields that arrive with the module that serves them: `extends_in_place`.

Claims: a part's fields join the class itself (the one object every module imported), after the
base's, so objects made before still read the part's defaults; the base's check runs, then the
part's, on construction and on `dataclasses.replace`; the grown class pickles as itself; a part may
not declare a field the class has, nor one without a default; a module imported afresh replaces
its part instead of clashing with it. And `SamplingParams` itself: chapter 1 declares only the
sampling fields, and chapter 13's modules add theirs.
"""

from __future__ import annotations

import pickle
from dataclasses import FrozenInstanceError, dataclass, fields, replace
from typing import List

import pytest

from minisgl.utils.settings import extends_in_place

CALLS: List[str] = []  # the order in which the toy class's checks ran


@dataclass(frozen=True)
class Toy:
    a: int = 1

    def __post_init__(self) -> None:
        CALLS.append("base")
        if self.a < 0:
            raise ValueError("a must be >= 0")


BEFORE = Toy(3)  # made before any part is registered


@dataclass(frozen=True)
class ToyPart:
    b: int = -1

    def __post_init__(self) -> None:
        CALLS.append("part")
        if self.b < -1:
            raise ValueError("b must be >= -1")


Grown = Toy  # the name stays bound to the same class: extends_in_place changes it, it makes no copy
extends_in_place(Toy)(ToyPart)


def test_a_part_grows_the_class_itself():
    assert Grown is Toy and [f.name for f in fields(Toy)] == ["a", "b"]
    assert BEFORE.b == -1 and BEFORE == Toy(3, -1)  # an older object reads the part's default
    CALLS.clear()
    t = Toy(a=2, b=5)
    assert CALLS == ["base", "part"]
    assert repr(t) == "Toy(a=2, b=5)" and t != Toy(a=2) and hash(t) == hash(Toy(2, 5))
    with pytest.raises(FrozenInstanceError):
        t.b = 1  # type: ignore[misc]
    assert pickle.loads(pickle.dumps(t)) == t


@pytest.mark.parametrize("kw, message", [({"a": -1}, "a must"), ({"b": -2}, "b must")])
def test_every_check_runs_on_construction_and_on_replace(kw, message):
    with pytest.raises(ValueError, match=message):
        Toy(**kw)
    with pytest.raises(ValueError, match=message):
        replace(Toy(), **kw)


def test_a_part_may_not_redeclare_a_field_nor_leave_one_without_default():
    @dataclass(frozen=True)
    class Again:
        a: int = 0

    @dataclass(frozen=True)
    class NoDefault:
        c: int

    with pytest.raises(TypeError, match="already has"):
        extends_in_place(Toy)(Again)
    with pytest.raises(TypeError, match="needs a default"):
        extends_in_place(Toy)(NoDefault)
    assert [f.name for f in fields(Toy)] == ["a", "b"]  # a refused part leaves no trace


def test_a_part_registered_again_replaces_itself():
    @dataclass(frozen=True)
    class ToyPart:
        b: int = 7

    ToyPart.__qualname__ = "ToyPart"  # the same qualified name, as when its module is imported afresh
    try:
        extends_in_place(Toy)(ToyPart)
        assert [f.name for f in fields(Toy)] == ["a", "b"] and Toy().b == 7
    finally:
        extends_in_place(Toy)(globals()["ToyPart"])
    assert Toy().b == -1


def test_sampling_params_gets_chapter_13s_fields_from_chapter_13s_modules():
    import minisgl.scheduler  # noqa: F401  (the complete package, as every front end imports it)
    from minisgl import core
    from minisgl.engine.grammar import JsonParams
    from minisgl.engine.logprobs import LogprobParams
    from minisgl.utils.settings import config_parts

    assert set(config_parts(core.SamplingParams)) == {JsonParams, LogprobParams}
    added = {f.name for part in (JsonParams, LogprobParams) for f in fields(part)}
    assert added == {"json_mode", "json_schema", "logprobs"}
    assert added <= {f.name for f in fields(core.SamplingParams)}
    source = open(core.__file__).read()
    assert not any(name in source for name in added)  # chapter 1 names none of them


def test_the_tokenizer_process_decodes_every_field_a_request_carries():
    # a process that imports the tokenizer worker and nothing more (as the server's tokenizer process
    # could) must rebuild a request with chapter 13's fields, not fail or drop them
    import subprocess
    import sys

    from minisgl.message import TokenizeMsg
    from minisgl.message.serde import serialize

    import minisgl.scheduler  # noqa: F401  (the sender: the complete package)
    from minisgl.core import SamplingParams

    msg = TokenizeMsg(1, "hi", False, SamplingParams(max_tokens=4, json_mode="object", logprobs=2))
    child = ("import sys; from minisgl.tokenizer.worker import TokenizerWorker; from minisgl.message.serde import deserialize; "
             "p = deserialize(sys.stdin.buffer.read()).sampling_params; print(p.json_mode, p.logprobs)")
    run = subprocess.run([sys.executable, "-c", child], input=serialize(msg), capture_output=True, timeout=120)
    assert run.returncode == 0 and run.stdout.decode().split() == ["object", "2"], run.stderr.decode()[-2000:]


@pytest.mark.parametrize("kw, field", [
    (dict(logprobs=21), "logprobs"),
    (dict(logprobs=-2), "logprobs"),
    (dict(json_mode="yaml"), "json_mode"),
    (dict(json_mode="schema"), "json_schema"),
    (dict(json_mode="schema", json_schema="{not json"), "json_schema"),
    (dict(json_mode="object", json_schema='{"type": "object"}'), "json_schema"),
    (dict(json_mode="object", ignore_eos=True), "ignore_eos"),
    (dict(json_mode="object", min_tokens=3), "min_tokens"),
])
def test_chapter_13s_fields_refuse_bad_values_by_name(kw, field):
    import minisgl.scheduler  # noqa: F401  (the modules that add the fields)
    from minisgl.core import InvalidRequestError, SamplingParams

    with pytest.raises(InvalidRequestError, match=field):
        SamplingParams(**kw)


def test_chapter_13s_fields_at_their_edges_are_accepted():
    import minisgl.scheduler  # noqa: F401
    from minisgl.core import SamplingParams

    SamplingParams(logprobs=20)
    SamplingParams(json_mode="schema", json_schema='{"type": "object", "properties": {"a": {"type": "integer"}}}')
