"""Exercises derived from the engine: the answer is the engine's own code dropped into the
starter, a wrong variant is a declared edit of it, and an edit that no longer applies fails
`judge.py check` loudly instead of silently testing something else."""

from __future__ import annotations

import ast
import inspect
import textwrap
from concurrent.futures import ThreadPoolExecutor

import pytest

from judge import check, registry, variants
from judge.api import Replace

IDS = registry.exercise_ids()


def _defs(source: str, replaces) -> dict:
    """Each replaced symbol's body as an AST dump, its docstring left out."""
    tree, out = ast.parse(source), {}
    for r in replaces:
        node = variants._find(tree, r.owner, r.attr)
        body = node.body if node is not None else []
        if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
            body = body[1:]
        out[r.qualname] = ast.dump(ast.Module(body=body, type_ignores=[])) if node is not None else None
    return out


def test_engine_source_is_the_live_engine_code() -> None:
    from minisgl.scheduler.prefill import PrefillAdder

    got = variants.engine_source(Replace("minisgl.scheduler.prefill", "PrefillAdder.try_admit"))
    assert got == textwrap.dedent(inspect.getsource(PrefillAdder.try_admit))


@pytest.mark.parametrize("exercise_id", IDS)
def test_every_exercise_builds_from_the_engine(exercise_id: str) -> None:
    ex = registry.load(exercise_id)
    d = registry.folder(exercise_id)
    assert not (d / "solution.py").exists() and not (d / "wrong").exists(), "answers and variants are derived, not copied"
    declared = variants.declared(exercise_id)
    assert declared, f"{exercise_id}: no wrong variants in wrong.toml"
    base = variants.base_source(ex)
    compile(base, f"{exercise_id} answer", "exec")
    # the answer is the engine's code: only the declared [answer] edits may make it differ
    answer_edits = variants._read(exercise_id).get("answer", {}).get("edits", [])
    engine = variants.engine_answer(ex)
    assert base == engine or answer_edits, f"{exercise_id}: the answer differs from the engine's code without a declared edit"
    assert _defs(engine, ex.replaces) == {r.qualname: _defs(variants.engine_source(r), [Replace(r.module, r.attr)])[r.attr] for r in ex.replaces}
    for v in declared:
        wrong = variants.apply(base, v)
        compile(wrong, f"{exercise_id} {v.name}", "exec")
        assert sum(len(e.old.splitlines()) + len(e.new.splitlines()) for e in v.edits) <= 16, f"{v.name}: keep a variant a small edit"


def _with(monkeypatch: pytest.MonkeyPatch, exercise_id: str, edit: dict) -> None:
    real = variants._read

    def patched(ex_id: str) -> dict:
        data = real(ex_id)
        if ex_id == exercise_id:
            data = dict(data, variant=[*data["variant"], {"name": "drifted", "why": "a test edit", "edits": [edit]}])
        return data

    monkeypatch.setattr(variants, "_read", patched)


def test_an_edit_that_no_longer_matches_fails_check(monkeypatch: pytest.MonkeyPatch) -> None:
    _with(monkeypatch, "base-op", {"old": "            if name.startswith('_'):  # not in the engine\n", "new": ""})
    with pytest.raises(variants.VariantError, match=r"variant 'drifted', edit 1: its old text does not occur"):
        variants.materialise(registry.load("base-op"))
    res = check.check_one("base-op")
    assert not res.ok and any("'drifted'" in p and "does not occur" in p for p in res.problems), res.problems


def test_an_edit_that_matches_twice_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    _with(monkeypatch, "base-op", {"old": "result", "new": "out"})
    with pytest.raises(variants.VariantError, match=r"occurs \d+ times"):
        variants.materialise(registry.load("base-op"))


def test_a_variant_that_changes_nothing_or_lacks_a_reason_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    v = variants.Variant("same", "no change", (variants.Edit("import torch\n", "import torch\n"),))
    with pytest.raises(variants.VariantError, match="changes nothing"):
        variants.apply("import torch\n", v)
    monkeypatch.setattr(variants, "_read", lambda ex_id: {"variant": [{"name": "x", "edits": [{"old": "a", "new": "b"}]}]})
    with pytest.raises(variants.VariantError, match="needs a name, a why"):
        variants.declared("base-op")


def _shared_symbols():
    """(earlier exercise, later exercise, symbol) for every symbol two exercises both require."""
    decl = sorted((registry.declared(i) for i in IDS), key=lambda e: e.chapter)
    out = []
    for k, a in enumerate(decl):
        for b in decl[k + 1 :]:
            later = {(r.module, r.qualname) for r in b.replaces if not r.optional}
            out += [(a.id, b.id, r) for r in a.replaces if not r.optional and (r.module, r.qualname) in later and a.chapter < b.chapter]
    return out


@pytest.mark.parametrize("earlier, later, symbol", _shared_symbols(), ids=lambda x: getattr(x, "qualname", x))
def test_an_answer_shows_no_later_exercise_answer(earlier: str, later: str, symbol: Replace) -> None:
    """Where a later chapter's exercise asks for a new version of the same engine symbol, the
    engine's def is the later answer: the earlier exercise's answer must be its own version, or
    `judge.py answer` would hand out the later exercise."""
    base = variants.base_source(registry.load(earlier))
    engine = variants.engine_source(symbol)
    assert _defs(base, [symbol])[symbol.qualname] != _defs(engine, [Replace(symbol.module, symbol.attr)])[symbol.attr], (
        f"{earlier}'s answer shows {symbol.qualname} as the engine has it, which is {later}'s answer: "
        f"declare an [answer] edit in exercises/{earlier}/wrong.toml that gives {earlier}'s own version")


def test_materialising_the_same_exercise_at_once_from_many_places_is_safe(tmp_path) -> None:
    """Test workers (and two notebooks) write the same generated files at the same time: none may
    fail, nor read half a file, and a variant no longer declared is still cleared away."""
    ex = registry.load("req-lengths")
    (tmp_path / "wrong").mkdir()
    (tmp_path / "wrong" / "renamed_since.py").write_text("# an old variant\n")
    expected = {key: path.read_text() for key, path in variants.materialise(ex, tmp_path / "reference").items()}
    seen: list = []

    def worker() -> None:
        for _ in range(5):
            files = variants.materialise(ex, tmp_path)
            seen.append({key: path.read_text() for key, path in files.items()})

    with ThreadPoolExecutor(6) as pool:
        for f in [pool.submit(worker) for _ in range(6)]:
            f.result()  # re-raises what a worker hit
    assert len(seen) == 30 and all(s == expected for s in seen)
    assert sorted(p.name for p in (tmp_path / "wrong").iterdir()) == sorted(k.split("/")[1] for k in expected if "/" in k)
