"""Numbers in chapter prose are printed by a cell or declared with their source (`tools/prose_numbers.py`).

Claims: every number of every chapter's markdown is printed by a code cell of that chapter or
declared in `tools/prose_numbers.toml`, and every declaration still holds (its phrase is in the
prose, its source gives the number as written); the scanner finds a hand-typed number in a
synthetic notebook, leaves out what its rule says is not a claim, and a declaration that no longer
matches its source, or names no number of the prose, is reported.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tools"))
import prose_numbers as pn  # noqa: E402


def test_every_number_in_the_prose_is_printed_or_declared():
    problems = pn.findings()
    assert not problems, "numbers typed by hand (print them from a cell, or declare them in tools/prose_numbers.toml):\n" + "\n".join(problems)


def _notebook(tmp_path: Path, markdown: str, printed: str = "", name: str = "98_synthetic.ipynb") -> Path:
    cells = [{"cell_type": "markdown", "metadata": {}, "source": [markdown]},
             {"cell_type": "code", "metadata": {}, "execution_count": 1, "source": ["print(...)"],
              "outputs": [{"output_type": "stream", "name": "stdout", "text": [printed]}]}]
    path = tmp_path / name
    path.write_text(json.dumps({"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    return path


def test_a_number_typed_by_hand_is_found(tmp_path: Path):
    nb = _notebook(tmp_path, "Notice the pool holds 1,234 pages and a step takes 5.2 ms on this CPU.", printed="pages: 1234\n")
    problems = pn.findings([nb], declarations=[])
    assert len(problems) == 1 and "'5.2'" in problems[0], problems


@pytest.mark.parametrize("text, expected", [
    ("A decode step is 2.7x faster, 69% of the pool, x1.9 the batch, -100 of bias.", ["2.7", "69", "1.9", "-100"]),
    ("As chapter 7 showed (chapters 9, 10 and 11 too; section 3, exercise 2, stages 1 to 4), it works.", []),
    ("## 4. Experiment\n\n1. first\n2. second", []),
    ("`MAX_PASSED_OVER = 8` and\n```python\nx = 42\n```\n", []),
    ("float32, H200, uid6, Qwen2.5, 2D, top-5 and GPT-2 are names.", []),
    ("Measured on 2026-12-04, as in 2017.", []),
    ("Prompts of 8–24 tokens.", ["8", "24"]),
    ("| chapter | pages |\n| --- | --- |\n| 7 | 160 |", ["160"]),
    ("Math $2 \\times 48 = 96$ in prose is scanned.", ["2", "48", "96"]),
    ("### Self-test\n\n1. A budget of 64 tokens?\n\n<details>\n\n1. $64 - 40 = 24$ left, then 12 steps.\n</details>", ["12"]),
    ("## 2. Questions\n\n1. With 1000 pages?\n\n<details>\n\n1. 240 pages.\n</details>", ["240"]),
])
def test_the_scanning_rule(text: str, expected: list):
    assert [n.text for n in pn.numbers_in(text)] == expected


def test_a_number_the_code_next_to_it_spells_out_is_accounted_for(tmp_path: Path):
    nb = _notebook(tmp_path, "Ban it with a bias of -100 and build 20,000 pages.")
    cells = json.loads(nb.read_text())
    cells["cells"][1]["source"] = ["bias, pages = -100.0, 20_000"]
    nb.write_text(json.dumps(cells))
    assert pn.findings([nb], declarations=[]) == []
    cells["cells"][1]["source"] = ["bias, pages = -99.0, 20_000"]
    nb.write_text(json.dumps(cells))
    assert len(pn.findings([nb], declarations=[])) == 1


def test_an_answer_restating_its_question_states_no_new_number():
    text = "### Self-test\n\n1. Prompts of 40 tokens, a budget of 64?\n2. Why?\n\n<details>\n\n1. The first 40 whole, 24 of the next.\n2. 40 again.\n</details>"
    assert [n.text for n in pn.numbers_in(text)] == ["24", "40"]


def _declared(text: str, near: str, **source) -> pn.Declaration:
    kind, ref = next(iter(source.items()))
    return pn.Declaration("98", text, near, kind, ref)


def test_a_declaration_covers_its_number_and_is_checked_against_its_source(tmp_path: Path):
    nb = _notebook(tmp_path, "A request is passed over at most 8 times.")
    right = _declared("8", "at most 8 times", code="minisgl.scheduler.prefill:MAX_PASSED_OVER")
    assert pn.findings([nb], declarations=[right]) == []
    wrong = _declared("8", "at most 8 times", expr="minisgl.scheduler.prefill.MAX_PASSED_OVER + 1")
    (problem,) = pn.findings([nb], declarations=[wrong])
    assert "gives 9" in problem


def test_a_declared_value_is_rounded_as_the_prose_rounds_it(tmp_path: Path):
    nb = _notebook(tmp_path, "The mean batch was 14.6 and the rate 38%.")
    ok = [pn.Declaration("98", "14.6", "batch was 14.6", "expr", "14.6037"),
          pn.Declaration("98", "38", "rate 38%", "expr", "0.3825", scale=100)]
    assert pn.findings([nb], declarations=ok) == []
    off = [pn.Declaration("98", "14.6", "batch was 14.6", "expr", "14.66"), ok[1]]
    assert len(pn.findings([nb], declarations=off)) == 1


def test_a_json_source_and_a_test_source(tmp_path: Path):
    json_decl = _declared("3.57", "floor of 3.57", json="minisgl/benchmark/results/offline_h200.json:floor.seconds")
    assert pn.check_declaration(json_decl) is None
    assert "gives" in pn.check_declaration(_declared("3.58", "floor of 3.58", json=json_decl.ref))
    this = "tests/test_prose_numbers.py::test_a_json_source_and_a_test_source"
    assert pn.check_declaration(_declared("3.57", "x 3.57", test=this)) is None  # this test's source has 3.57
    absent = f"{7 * 11}.5"  # a number this test's source does not spell out
    assert "does not check" in pn.check_declaration(_declared(absent, f"x {absent}", test=this))
    assert "has no test" in pn.check_declaration(_declared("3.57", "x 3.57", test="tests/test_prose_numbers.py::nothing"))


def test_a_stale_declaration_is_reported(tmp_path: Path):
    nb = _notebook(tmp_path, "No number here any more.")
    (problem,) = pn.findings([nb], declarations=[_declared("8", "at most 8 times", definition="a reason")])
    assert "no such number" in problem


def test_a_malformed_declaration_is_refused(tmp_path: Path):
    bad = tmp_path / "bad.toml"
    bad.write_text('[[number]]\nchapter = "06"\ntext = "4"\nnear = "has 4 bytes"\n')
    with pytest.raises(pn.DeclarationError, match="exactly one of"):
        pn.load_declarations(bad)
    bad.write_text('[[number]]\nchapter = "06"\ntext = "4"\nnear = "has four bytes"\ndefinition = "float32"\n')
    with pytest.raises(pn.DeclarationError, match="must contain"):
        pn.load_declarations(bad)
