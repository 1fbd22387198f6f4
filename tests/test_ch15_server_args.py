"""Chapter 15, the command line of `python -m minisgl`, generated from the config dataclasses.

Claims: every field of `EngineConfig`, `SchedulerConfig` and `ServerConfig` (bar the ones the
program sets itself) has a flag carrying the field's help text, and every flag of before is still
there under its name; a bare command line builds exactly the dataclasses' defaults, and one that
sets every flag builds exactly the configs written out by hand; types, choices and bool flags
follow the fields; bad values end in a usage error; `--help` is grouped by dataclass; and
`MINISGL_DISABLE_OVERLAP=1` means the same for the server, the offline `LLM` and the benchmark,
with an explicit flag or keyword winning (checked in a fresh process with the variable set).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from dataclasses import fields
from typing import Dict, List

import pytest
from transformers import AutoTokenizer

from helpers import REPO_ROOT, TINY_LLAMA
from minisgl.engine import EngineConfig
from minisgl.scheduler import SchedulerConfig
from minisgl.server.args import ServerArgs, ServerConfig, build_parser, parse_args
from minisgl.server.launch import _server_tokenizer
from minisgl.utils.misc import UnknownOptionError, add_config_flags, option_fields

CONFIGS = (EngineConfig, SchedulerConfig, ServerConfig)
NOT_FLAGS = {"tp_rank", "offline"}  # set by the program: the tensor-parallel launcher, the offline LLM

# the flags `python -m minisgl` took before they were generated (README, chapters and tests use them)
FLAGS_BEFORE = """--model --served-model-name --tokenizer --dummy-weights --host --port --shell --shell-max-tokens
--device --dtype --tp-size --page-size --max-running-reqs --max-seq-len --num-pages --memory-fraction --cpu-kv-budget-gb
--attention-backend --disable-cuda-graph --prefix-cache --max-extend-tokens --schedule-policy --disable-overlap --seed
--max-request-bytes --drain-timeout --log-level""".split()

# a value other than the default for every setting (a new field must be added here)
NON_DEFAULT = {
    "model_path": str(TINY_LLAMA), "device": "cpu", "dtype": "bfloat16", "page_size": 4, "max_running_reqs": 3,
    "max_seq_len": 100, "num_pages": 50, "memory_fraction": 0.5, "cpu_kv_budget_gb": 0.25, "attention_backend": "torch",
    "use_cuda_graph": False, "cuda_graph_max_bs": 8, "dummy_weights": True, "seed": 7, "tp_size": 2,
    "prefix_cache": "naive", "max_extend_tokens": 64, "schedule_policy": "fcfs", "overlap": False, "check_integrity": True,
    "served_model_name": "m", "tokenizer": str(TINY_LLAMA), "host": "0.0.0.0", "port": 3000, "shell": True,
    "shell_max_tokens": 5, "log_level": "info", "max_request_bytes": 4096, "drain_timeout_s": 2.5,
    "grammar_timeout_s": 3.0, "max_schema_bytes": 4096, "grammar_cache_mb": 64,
}


def _actions() -> Dict[str, argparse.Action]:
    return {a.dest: a for a in build_parser()._actions if a.dest != "help"}


def _argv(values: Dict[str, object]) -> List[str]:
    """A command line that sets `values`, written from the parser's own flags."""
    argv: List[str] = []
    for name, value in values.items():
        spellings = _actions()[name].option_strings
        if isinstance(value, bool):
            argv.append(next(s for s in spellings if s.startswith("--disable-") != value))
        else:
            argv += [spellings[0], str(value)]
    return argv


def test_every_field_has_a_flag_with_its_help():
    actions = _actions()
    for cls in CONFIGS:
        for f in fields(cls):
            if f.name == "engine":
                continue
            assert f.metadata.get("help", "").strip(), f"{cls.__name__}.{f.name} declares no help"
            if f.name in NOT_FLAGS:
                assert f.name not in actions
                continue
            assert f.name in actions, f"{cls.__name__}.{f.name} has no flag"
            assert actions[f.name].help.startswith(f.metadata["help"])
    assert set(actions) == set(option_fields(ServerArgs)) - NOT_FLAGS  # and no flag without a field


def test_the_flags_of_before_keep_their_names():
    spellings = {s for a in _actions().values() for s in a.option_strings}
    assert set(FLAGS_BEFORE) <= spellings, set(FLAGS_BEFORE) - spellings


def test_a_bare_command_line_builds_the_dataclass_defaults():
    assert parse_args([]) == ServerArgs(scheduler=SchedulerConfig(engine=EngineConfig()), server=ServerConfig())
    assert parse_args(["--model", str(TINY_LLAMA)]).scheduler == SchedulerConfig(engine=EngineConfig(model_path=str(TINY_LLAMA)))


def test_every_flag_set_builds_the_configs_written_by_hand():
    # lpm_max_wait is read only by lpm-aged, which needs the radix cache: test_ch22 sets all three
    assert set(NON_DEFAULT) | {"lpm_max_wait"} == set(option_fields(ServerArgs)) - NOT_FLAGS
    engine_names = {f.name for f in fields(EngineConfig)}
    server_names = {f.name for f in fields(ServerConfig)}
    engine = EngineConfig(**{k: v for k, v in NON_DEFAULT.items() if k in engine_names})
    scheduler = SchedulerConfig(engine=engine, **{k: v for k, v in NON_DEFAULT.items() if k not in engine_names | server_names})
    server = ServerConfig(**{k: v for k, v in NON_DEFAULT.items() if k in server_names})
    for name, value in NON_DEFAULT.items():  # really not the defaults, so each flag is seen to act
        if name == "schedule_policy":
            continue  # lpm needs the radix cache, and prefix_cache is set to naive here (test_ch22 sets lpm)
        owner = EngineConfig() if name in engine_names else ServerConfig() if name in server_names else SchedulerConfig()
        assert getattr(owner, name) != value, name
    assert parse_args(_argv(NON_DEFAULT)) == ServerArgs(scheduler=scheduler, server=server)


def test_types_choices_and_bool_flags_follow_the_fields():
    actions = _actions()
    assert actions["page_size"].type is int and actions["memory_fraction"].type is float and actions["device"].type is str
    assert actions["max_seq_len"].type is int  # Optional[int]
    assert list(actions["dtype"].choices) == ["auto", "float32", "bfloat16", "float16"]
    assert list(actions["prefix_cache"].choices) == ["naive", "radix"] and list(actions["schedule_policy"].choices) == ["fcfs", "lpm", "lpm-aged"]
    assert actions["dummy_weights"].option_strings == ["--dummy-weights"]  # default False: switched on
    assert actions["shell"].option_strings == ["--shell"]
    # defaults computed from the environment take either spelling, so a flag can override either way
    assert actions["overlap"].option_strings == ["--overlap", "--disable-overlap"]
    assert actions["use_cuda_graph"].option_strings == ["--cuda-graph", "--disable-cuda-graph"]
    assert parse_args(["--disable-cuda-graph"]).engine.use_cuda_graph is False
    assert parse_args(["--disable-overlap", "--overlap"]).scheduler.overlap is True  # the last one given wins


@pytest.mark.parametrize("argv, message", [
    (["--dtype", "float64"], "invalid choice: 'float64'"),
    (["--page-size", "3"], "page_size must be a power of two"),
    (["--page-size", "four"], "invalid int value: 'four'"),
    (["--port", "0"], "port must be in 1..65535"),
    (["--schedule-policy", "lpm", "--prefix-cache", "naive"], "a prefix cache that keeps prefixes"),
    (["--model", "/no/such/model"], "model directory /no/such/model does not exist"),
    (["--max-extnd-tokens", "64"], "unrecognized arguments: --max-extnd-tokens"),
])
def test_bad_values_are_usage_errors(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        parse_args(argv)
    assert e.value.code == 2 and message in capsys.readouterr().err


def test_help_is_grouped_by_dataclass():
    text = build_parser().format_help()
    starts = [text.index(f"\n{cls.__name__}: ") for cls in (EngineConfig, SchedulerConfig, ServerConfig)]
    assert starts == sorted(starts)
    engine_part, scheduler_part = text[starts[0]:starts[1]], text[starts[1]:starts[2]]
    assert "--page-size" in engine_part and "--max-extend-tokens" in scheduler_part and "--port" in text[starts[2]:]
    assert "(default: 1919)" in text and "MINISGL_DISABLE_OVERLAP=1" in scheduler_part


OVERLAP_PROBE = f"""
import json, sys
sys.path.insert(0, {str(REPO_ROOT / 'tests')!r})
from minisgl.benchmark import offline
from minisgl.llm import LLM
from minisgl.scheduler import SchedulerConfig
from minisgl.server.args import parse_args
from minisgl.utils.misc import config_options
model = {str(TINY_LLAMA)!r}
small = dict(device="cpu", max_seq_len=64, num_pages=64)
options = config_options(offline._parse(["--model", model]), SchedulerConfig)  # as offline.main reads them
options.pop("model_path")
print(json.dumps({{
    "server": parse_args(["--model", model]).scheduler.overlap,
    "server_flag_on": parse_args(["--model", model, "--overlap"]).scheduler.overlap,
    "server_flag_off": parse_args(["--model", model, "--disable-overlap"]).scheduler.overlap,
    "shell": parse_args(["--model", model, "--shell"]).scheduler.overlap,
    "llm": LLM(model, **small).config.overlap,
    "llm_keyword_on": LLM(model, overlap=True, **small).config.overlap,
    "benchmark": offline.build_llm(model, dummy_weights=False, **options, **small).config.overlap,
}}))
"""


@pytest.mark.parametrize("value, default", [("1", False), (None, True)])
def test_the_overlap_switch_means_the_same_for_every_front_end(value, default):
    env = {k: v for k, v in os.environ.items() if k != "MINISGL_DISABLE_OVERLAP"}
    if value is not None:
        env["MINISGL_DISABLE_OVERLAP"] = value
    proc = subprocess.run([sys.executable, "-c", OVERLAP_PROBE], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    assert seen == {"server": default, "server_flag_on": True, "server_flag_off": False, "shell": default,
                    "llm": default, "llm_keyword_on": True, "benchmark": default}


def test_a_program_can_leave_settings_out_of_its_flags():
    """`exclude` drops the flags of settings a program decides itself (a benchmark's batch sizes);
    a name that is no setting is an error, not a flag silently left in."""
    p = argparse.ArgumentParser()
    add_config_flags(p, SchedulerConfig, exclude=("overlap", "page_size"))
    dests = {a.dest for a in p._actions}
    assert {"overlap", "page_size"}.isdisjoint(dests) and {"device", "prefix_cache", "max_extend_tokens"} <= dests
    with pytest.raises(SystemExit):
        p.parse_args(["--page-size", "4"])
    for bad in ({"exclude": ("page_sise",)}, {"helps": {"modle_path": "x"}}):
        with pytest.raises(UnknownOptionError, match="did you mean"):
            add_config_flags(argparse.ArgumentParser(), SchedulerConfig, **bad)


def test_a_folder_without_a_tokenizer_serves_random_weights_with_token_numbers_and_nothing_else(tmp_path):
    (tmp_path / "config.json").write_text((TINY_LLAMA / "config.json").read_text())  # a config-only folder
    vocab_size = json.loads((TINY_LLAMA / "config.json").read_text())["vocab_size"]
    tok = _server_tokenizer(ServerArgs.from_options(model_path=str(tmp_path), dummy_weights=True))
    assert len(tok) == vocab_size and tok.decode([3, 1]) == "<3><1>"
    with pytest.raises(FileNotFoundError, match="holds no tokenizer.*--tokenizer DIR"):
        _server_tokenizer(ServerArgs.from_options(model_path=str(tmp_path)))  # real weights need their tokenizer
    real = _server_tokenizer(ServerArgs.from_options(model_path=str(tmp_path), dummy_weights=True,
                                                     tokenizer=str(TINY_LLAMA)))
    assert real.decode([3, 1]) == AutoTokenizer.from_pretrained(TINY_LLAMA).decode([3, 1])


@pytest.mark.parametrize("graphs, said", [
    (True, ", then compiling GPU kernels and capturing CUDA graphs"),
    (False, ", then compiling GPU kernels"),
])
def test_the_start_up_message_says_what_the_engine_registered_to_run_on_a_gpu(graphs, said):
    """Nothing is built: a CUDA device by name only, so this runs on the CPU too."""
    from minisgl.server.launch import _loading

    args = parse_args(["--model", str(TINY_LLAMA), "--device", "cuda", "--cuda-graph" if graphs else
                       "--disable-cuda-graph"])
    assert _loading(args).endswith(f"onto cuda:0{said}")
    cpu = parse_args(["--model", str(TINY_LLAMA), "--device", "cpu"])
    assert _loading(cpu).endswith("onto cpu")
