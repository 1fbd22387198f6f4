#!/usr/bin/env python3
"""Generate a little text from the default model with the minisgl engine.

    python tools/demo.py [--model DIR] [--max-tokens N] [PROMPT ...]

The model defaults to $MINISGL_MODEL, else the bundled SmolLM2 directory made
by tools/prepare_models.py.  If the engine's offline entry point
(`minisgl.llm.LLM`) is not available yet, the script says so and exits.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

from minisgl.env import default_model_path  # noqa: E402

DEFAULT_PROMPTS = [
    "The capital of France is",
    "Write a haiku about the sea.",
]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("prompts", nargs="*", help="prompts (default: two examples)")
    parser.add_argument("--model", default=str(default_model_path()))
    parser.add_argument("--max-tokens", type=int, default=32)
    args = parser.parse_args(argv)
    prompts = args.prompts or DEFAULT_PROMPTS

    if not Path(args.model).is_dir():
        print(f"model directory {args.model} not found; run `make setup` "
              "(or `python tools/prepare_models.py`) first", file=sys.stderr)
        return 1

    try:
        from minisgl.llm import LLM
    except ImportError as exc:
        print("The minisgl engine's offline entry point (minisgl.llm.LLM) is not available "
              f"in this checkout yet ({exc}).\nNothing to demo; the notebooks in chapters/ "
              "build the engine step by step (`make lab`).")
        return 0

    try:
        from minisgl.core import SamplingParams  # type: ignore[attr-defined]
    except ImportError:
        SamplingParams = None  # noqa: N806

    print(f"loading {args.model} ...", flush=True)
    llm = LLM(args.model)
    if SamplingParams is not None:
        params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0)
        outputs = llm.generate(prompts, params)
    else:
        outputs = llm.generate(prompts)
    for prompt, out in zip(prompts, outputs):
        text = out.get("text") if isinstance(out, dict) else getattr(out, "text", out)
        print(f"\n>>> {prompt}\n{text}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
