"""Regenerate the locked package versions: requirements/cpu.txt, requirements/gpu.txt, environment.yml.

    python tools/lock.py             # keep every pin that still fits pyproject.toml, add what is new
    python tools/lock.py --upgrade   # re-resolve everything to the newest releases in range

`make lock` (and `make lock UPGRADE=1`) runs this, reinstalls .venv from the new lock and
re-records the judge's reference outputs, so the references always name the locked versions.

- requirements/cpu.txt: every package of the default CPU path (pyproject.toml's dependencies plus
  the lab and test extras), pinned exactly, torch included (the CPU build), resolved with uv for
  CPython 3.11 on Linux x86_64. `make setup` installs it as it is.
- requirements/gpu.txt: constraints for a machine with an NVIDIA driver (any platform and Python
  pyproject.toml admits, with markers where versions differ): the same packages plus the gpu extra
  (FlashInfer), without torch and what only torch pulls in (triton, its CUDA libraries): a GPU
  machine's torch may be any release in pyproject's range.
- environment.yml: its pip section is rewritten with the CPU pins (its comments are kept).

Without --upgrade, transformers and torch are held at the versions the judge's references in
judge/reference/*.json were recorded with, so a fresh set-up compares against them directly.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CPU_LOCK = ROOT / "requirements" / "cpu.txt"
GPU_CONSTRAINTS = ROOT / "requirements" / "gpu.txt"
ENVIRONMENT = ROOT / "environment.yml"
PLATFORM = "x86_64-manylinux_2_28"
CPU_PYTHON = "3.11"
# torch pins these exactly per release; on a GPU they must follow the image's torch.
TORCH_BOUND = {"torch", "triton"}
COMMAND = "make lock"


def _find_links() -> list[str]:
    """pip's configured find-links (where the CPU build of torch lies on disk), passed on to uv."""
    links = os.environ.get("PIP_FIND_LINKS", "").split()
    if not links:
        out = subprocess.run([sys.executable, "-m", "pip", "config", "get", "global.find-links"],
                             capture_output=True, text=True)
        links = out.stdout.split() if out.returncode == 0 else []
    return [arg for link in links for arg in ("--find-links", link)]


def recorded_versions() -> dict[str, str]:
    """torch and transformers as the judge's reference outputs name them (one version each)."""
    found: dict[str, set[str]] = {"torch": set(), "transformers": set()}
    for path in sorted((ROOT / "judge" / "reference").glob("*.json")):
        fingerprint = json.loads(path.read_text()).get("fingerprint", {})
        for name in found:
            if name in fingerprint:
                found[name].add(fingerprint[name])
    versions = {}
    for name, seen in found.items():
        if len(seen) > 1:
            raise SystemExit(f"judge/reference/*.json name several {name} versions ({sorted(seen)}): "
                             "re-record them (`python judge.py record`) or lock with --upgrade")
        if seen:
            versions[name] = seen.pop()
    return versions


def uv_compile(out: Path, target: list[str], extras: list[str], upgrade: bool, constraints: list[str],
               find_links: list[str]) -> None:
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as handle:
        handle.write("\n".join(constraints) + "\n")
    cmd = [sys.executable, "-m", "uv", "pip", "compile", "pyproject.toml", "--quiet",
           *target,
           "--custom-compile-command", COMMAND, "--constraints", handle.name, "-o", str(out),
           *find_links]
    for extra in extras:
        cmd += ["--extra", extra]
    if upgrade:
        cmd.append("--upgrade")
    try:
        subprocess.run(cmd, cwd=ROOT, check=True)
    finally:
        os.unlink(handle.name)


def parse(text: str) -> dict[str, tuple[str, list[str]]]:
    """uv's output: name -> (pin line, names it is required by)."""
    entries: dict[str, tuple[str, list[str]]] = {}
    current = None
    for line in text.splitlines():
        if line and not line.startswith((" ", "#")):
            current = line.split("==")[0].strip().lower()
            entries[current] = (line.strip(), [])
        elif current and line.strip().startswith("#"):
            words = line.strip().lstrip("#").strip()
            words = words[len("via"):].strip() if words.startswith("via") else words
            if words:
                entries[current][1].append(words.split()[0].lower())
    return entries


def drop_torch(text: str) -> str:
    """The uv output without torch and the packages only torch (transitively) requires."""
    entries = parse(text)
    dropped = set(TORCH_BOUND)
    changed = True
    while changed:
        changed = False
        for name, (_, parents) in entries.items():
            if name not in dropped and parents and all(p in dropped for p in parents):
                dropped.add(name)
                changed = True
    keep = []
    skipping = False
    for line in text.splitlines():
        if line and not line.startswith((" ", "#")):
            skipping = line.split("==")[0].strip().lower() in dropped
        if not skipping:
            keep.append(line)
    return "\n".join(keep) + "\n"


def pins(path: Path) -> list[str]:
    return [line.strip() for line in path.read_text().splitlines()
            if line and not line.startswith((" ", "#", "-"))]


def write_environment(cpu_pins: list[str]) -> None:
    text = ENVIRONMENT.read_text()
    head, sep, _ = text.partition("  - pip:\n")
    if not sep:
        raise SystemExit("environment.yml has no `  - pip:` section to rewrite")
    body = "".join(f'      - "{pin}"\n' for pin in cpu_pins)
    ENVIRONMENT.write_text(head + sep + body + '      - "-e ."\n')


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--upgrade", action="store_true",
                        help="re-resolve to the newest releases in pyproject.toml's ranges "
                             "(the judge's references must then be re-recorded)")
    args = parser.parse_args()
    CPU_LOCK.parent.mkdir(exist_ok=True)
    held = [] if args.upgrade else [f"{name}=={version}" for name, version in recorded_versions().items()]
    uv_compile(CPU_LOCK, ["--python-version", CPU_PYTHON, "--python-platform", PLATFORM], ["lab", "test"], args.upgrade, held, _find_links())
    held_gpu = [c for c in held if not c.startswith("torch==")]
    uv_compile(GPU_CONSTRAINTS, ["--universal"], ["lab", "test", "gpu"], args.upgrade, held_gpu, [])
    GPU_CONSTRAINTS.write_text(drop_torch(GPU_CONSTRAINTS.read_text()))
    write_environment(pins(CPU_LOCK))
    print(f"locked {len(pins(CPU_LOCK))} packages in {CPU_LOCK.relative_to(ROOT)}, "
          f"{len(pins(GPU_CONSTRAINTS))} in {GPU_CONSTRAINTS.relative_to(ROOT)}; environment.yml rewritten")


if __name__ == "__main__":
    main()
