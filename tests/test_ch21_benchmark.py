"""Chapter 21: benchmarks. The workload is the published one (token totals), the bandwidth floor
counts what a brute-force loop counts, the Hugging Face baseline generates what the engine
generates (float32 greedy), and both benchmark scripts run end to end in their quick mode. The
decode and overlap benchmarks take the engine's and the scheduler's flags exactly as `python -m
minisgl` does, bar the settings each one decides itself, and every command line the docs show parses."""

from __future__ import annotations

import json
import math
import re
import shlex
import statistics
from pathlib import Path

import pytest
import torch

from minisgl.benchmark import decode, offline, overlap
from minisgl.benchmark.hf_baseline import build_hf_model, hf_continuous_batching, hf_generate
from minisgl.engine import EngineConfig
from minisgl.scheduler import SchedulerConfig
from minisgl.server.args import build_parser as server_parser
from minisgl.utils.misc import config_options, option_fields

ROOT = Path(__file__).resolve().parent.parent


def test_workload_is_nano_vllms():
    w = offline.make_workload()
    assert len(w.prompts) == 256
    assert (w.input_tokens, w.output_tokens) == (142_827, 133_966)
    assert all(100 <= len(p) <= 1024 and all(0 <= t <= 10000 for t in p) for p in w.prompts)
    assert w.head(3).max_tokens == w.max_tokens[:3]


def test_decode_bytes_matches_a_step_by_step_count():
    w = offline.Workload([[1] * 5, [1] * 9, [1] * 2], [3, 1, 6])
    weight, per_token = 1000, 7
    total = 0
    for step in range(1, max(w.max_tokens)):
        total += weight  # every decode step reads the weights once
        for p, m in zip(w.prompts, w.max_tokens):
            if step < m:  # this request is still decoding: it reads its prompt and step tokens
                total += (len(p) + step) * per_token
    assert offline.decode_bytes(w, weight, per_token) == total


def test_the_workloads_floor_is_mostly_kv(models_dir):
    """Chapter 21's second question: for the Qwen3-0.6B shape in bfloat16, the KV part of the
    workload's decode bytes outweighs reading the weights once per step."""
    from minisgl.models import ModelConfig, create_model

    cfg = ModelConfig.from_dir(models_dir / "qwen3-0.6b-dummy")
    shapes = create_model(cfg, torch.bfloat16, torch.device("meta"))
    weight_bytes = sum(p.numel() * p.element_size() for p in shapes.state_dict().values())
    work = offline.make_workload()
    total = offline.decode_bytes(work, weight_bytes, 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * 2)
    weights = (max(work.max_tokens) - 1) * weight_bytes
    assert total - weights > weights


def _assert_baseline_generates_the_engines_tokens(models_dir, device: str, baseline) -> None:
    """A baseline is fair only if it does the same work: float32 greedy, the engine's tokens."""
    model = str(models_dir / "tiny-llama")
    w = offline.make_workload(3, 5, 30, 3, 8, seed=4)
    llm = offline.build_llm(model, dummy_weights=False, device=device, dtype="float32", max_running_reqs=4)
    ours = offline.run_workload(llm, w)
    offline.release(llm)
    hf = build_hf_model(model, torch.float32, torch.device(device), dummy_weights=False)
    base = baseline(hf, w.prompts, w.max_tokens)
    assert base.output_tokens == ours.output_tokens == w.output_tokens
    assert base.token_ids == ours.token_ids


def test_hf_baseline_generates_the_engines_tokens(models_dir):
    _assert_baseline_generates_the_engines_tokens(models_dir, "cpu", hf_generate)


@pytest.mark.gpu
def test_hf_continuous_batching_generates_the_engines_tokens(models_dir):
    """transformers' continuous batching (slow on the CPU: minutes for a few tokens, so on the GPU)."""
    _assert_baseline_generates_the_engines_tokens(models_dir, "cuda", hf_continuous_batching)


def test_offline_quick_runs_the_whole_workload():
    result = offline.main(["--quick", "--device", "cpu"])
    w = offline.make_workload(8, 8, 48, 4, 12)
    assert result.output_tokens == w.output_tokens
    assert [len(t) for t in result.token_ids] == w.max_tokens
    assert result.prefill_steps >= 1 and result.decode_steps == max(w.max_tokens) - 1
    assert result.tokens_per_s > 0


def _record_builds(module, monkeypatch) -> list:
    """The engines `module` builds, kept (the real `build_llm` still builds them)."""
    built = []

    def build(*args, **kwargs):
        built.append(module.__dict__["_real_build_llm"](*args, **kwargs))
        return built[-1]

    monkeypatch.setitem(module.__dict__, "_real_build_llm", module.build_llm)
    monkeypatch.setattr(module, "build_llm", build)
    return built


def test_decode_quick_reports_every_batch_size(monkeypatch):
    built = _record_builds(decode, monkeypatch)
    results = decode.main(["--quick", "--device", "cpu", "--page-size", "4", "--attention-backend", "torch"])
    assert [(r.batch_size, r.cuda_graph) for r in results] == [(1, False), (4, False)]
    assert all(math.isfinite(r.tpot_s) and r.tpot_s > 0 for r in results)
    # the engine flags reach the engine; the pool is sized for the batch in pages of that size
    [llm] = built
    assert (llm.engine.page_size, type(llm.engine.attn_backend).__name__, llm.device.type) == (4, "TorchAttnBackend", "cpu")
    assert llm.engine.num_pages == 4 * (16 + 4 + 8 + 4) // 4 + 16


def test_overlap_runs_both_loops_on_the_cpu(models_dir, monkeypatch, tmp_path):
    built = _record_builds(overlap, monkeypatch)
    out = tmp_path / "overlap.json"
    results = overlap.main(["--model", str(models_dir / "tiny-llama"), "--device", "cpu", "--page-size", "2",
                            "--batch-sizes", "1,2", "--input-len", "8", "--steps", "6", "--json", str(out)])
    assert [r.batch_size for r in results] == [1, 2]
    assert all(r.off.step_ms > 0 and r.on.step_ms > 0 and not r.off.overlap and r.on.overlap for r in results)
    assert [row["batch_size"] for row in json.loads(out.read_text())] == [1, 2]
    [llm] = built
    assert (llm.engine.page_size, llm.config.prefix_cache, llm.config.engine.max_running_reqs) == (2, "naive", 2)


@pytest.mark.parametrize("module", [decode, overlap], ids=lambda m: m.__name__.rsplit(".", 1)[-1])
def test_benchmark_engine_flags_are_the_servers(module):
    """Every engine and scheduler setting the benchmark does not decide itself is a flag spelt,
    typed and explained as `python -m minisgl` has it, defaulting to the config's own default;
    the ones it decides (SET_BY_RUN) have no flag at all."""
    ours = {a.dest: a for a in module.build_parser()._actions}
    theirs = {a.dest: a for a in server_parser()._actions}
    for name, (_, f) in option_fields(SchedulerConfig).items():
        if name not in theirs:  # set by the program (tp_rank), a flag nowhere
            assert name not in ours
        elif name in module.SET_BY_RUN:
            assert name not in ours, f"{module.__name__} sets {name} itself, yet has a flag for it"
            with pytest.raises(SystemExit):
                module.build_parser().parse_args([theirs[name].option_strings[0]] + ([] if theirs[name].nargs == 0 else ["1"]))
        else:
            a, b = ours[name], theirs[name]
            assert (a.option_strings, a.type, a.choices, a.default, a.nargs) == (b.option_strings, b.type, b.choices, b.default, b.nargs), name
            if name not in ("model_path", "dummy_weights"):  # the benchmarks say what their own default is
                assert a.help == b.help, name
    assert "(default: 1)" in ours["page_size"].help and EngineConfig.page_size == 1
    # nothing given, nothing passed on: the engine keeps the config's defaults
    assert config_options(module.build_parser().parse_args([]), SchedulerConfig) == {}


def _documented_commands(module: str) -> list:
    """The arguments of every `python -m minisgl.benchmark.<module> ...` that the docs show:
    command lines in backticks in the README, RESULTS.md and the chapters' prose, and the lines
    of the benchmarks' docstrings and the GPU check script."""
    prose = [(ROOT / "README.md").read_text(), (ROOT / "minisgl/benchmark/RESULTS.md").read_text()]
    for nb in sorted((ROOT / "chapters").glob("*.ipynb")):
        prose += ["".join(c["source"]) for c in json.loads(nb.read_text())["cells"] if c["cell_type"] == "markdown"]
    call = re.compile(rf"-m minisgl\.benchmark\.{module}\b(.*)", re.S)
    found = [m.group(1) for text in prose for span in re.findall(r"`([^`]*)`", text) if (m := call.search(span))]
    line_call = re.compile(rf"^\s*(?:python3?|step \$PY) -m minisgl\.benchmark\.{module}\b([^#]*)")
    for script in (*sorted((ROOT / "minisgl/benchmark").glob("*.py")), ROOT / "tools/gpu_check.sh"):
        found += [m.group(1) for line in script.read_text().splitlines() if (m := line_call.match(line))]
    return found


@pytest.mark.parametrize("module", [decode, overlap], ids=lambda m: m.__name__.rsplit(".", 1)[-1])
def test_documented_command_lines_parse(module):
    short = module.__name__.rsplit(".", 1)[-1]
    commands = _documented_commands(short)
    assert len(commands) >= 3, commands  # RESULTS.md, the docstring and a chapter name each
    for args in commands:
        module.build_parser().parse_args(shlex.split(args))  # a usage error exits: the test fails


def test_kernel_profile_groups_by_family_and_averages_over_steps():
    assert decode.kernel_name("void flashinfer::BatchDecodeKernel<128u, 4u>(Params)") == "flashinfer::BatchDecodeKernel"
    assert decode.kernel_name("_rope_kernel") == "_rope_kernel"
    events = [("_rope_kernel", 0.0, 2.0), ("void gemv<1>(int)", 3.0, 10.0), ("Memcpy HtoD (Pinned -> Device)", 10.0, 11.0)]
    p = decode.group_kernels(events + [(n, s + 20, e + 20) for n, s, e in events], steps=2)
    assert p.kernels == 2  # the copy is not a kernel
    assert [(g.name, g.count, g.us) for g in p.groups] == [("gemv", 1, 7.0), ("_rope_kernel", 1, 2.0), ("Memcpy HtoD", 1, 1.0)]
    assert (p.busy_us, p.span_us) == (10.0, 15.5)
    assert "GPU busy 10 us of a 16 us step span" in decode.kernel_table(p)


@pytest.mark.gpu
def test_graphs_make_small_batch_decode_faster():
    results = decode.main(["--batch-sizes", "1", "--input-len", "64", "--steps", "32"])
    by_graph = {r.cuda_graph: r.tpot_s for r in results}
    assert by_graph[True] < by_graph[False]


def test_cpu_benchmark_compares_both_workloads_with_transformers(models_dir):
    from minisgl.benchmark import cpu

    model = str(models_dir / "tiny-llama")
    results = cpu.main(["--model", model, "--prefill-len", "300", "--chat-prompts", "3", "--chat-tokens", "5", "--repeats", "1", "--threads", "1"])
    prefill, chat = results
    assert prefill.same == "same next token"
    assert chat.same == "3/3 requests token-equal"
    assert all(r.engine_s > 0 and r.hf_s > 0 and math.isfinite(r.speedup) for r in results)


def test_cpu_attention_hands_sdpa_a_batch_dimension(models_dir, monkeypatch):
    """3-D inputs send SDPA to its quadratic math path on the CPU; 4-D ones to the fused kernel."""
    import torch.nn.functional as F

    from minisgl.attention import torch_backend
    from minisgl.core import SamplingParams
    from minisgl.llm import LLM

    dims = []
    real = F.scaled_dot_product_attention

    def spy(q, k, v, **kw):
        dims.append(q.dim())
        return real(q, k, v, **kw)

    monkeypatch.setattr(torch_backend.F, "scaled_dot_product_attention", spy)
    llm = LLM(str(models_dir / "tiny-llama"), device="cpu", dtype="float32")
    llm.generate([list(range(5, 40))], SamplingParams(max_tokens=3))
    llm.shutdown()
    assert dims and set(dims) == {4}


def test_time_by_batch_size_gives_each_step_the_time_until_the_next_launch():
    from minisgl.scheduler.scheduler import StepTrace

    trace = [
        StepTrace(0, "prefill", [0, 1], [5, 7], [0, 0], launched_at=10.0),
        StepTrace(1, "decode", [0, 1], [1, 1], [5, 7], launched_at=10.5),
        StepTrace(2, "decode", [0, 1], [1, 1], [6, 8], launched_at=10.7),
        StepTrace(3, "decode", [1], [1], [9], launched_at=11.0),
    ]
    groups = offline.time_by_batch_size(trace, end=11.4, weight_bytes=100, kv_bytes_per_token=10, bandwidth=1000.0, width=1)
    assert [(g.label, g.steps) for g in groups] == [("prefill", 1), ("decode, 1-1 requests", 1), ("decode, 2-2 requests", 2)]
    prefill, one, two = groups
    assert prefill.seconds == pytest.approx(0.5) and prefill.floor_s is None
    assert two.seconds == pytest.approx(0.2 + 0.3) and one.seconds == pytest.approx(0.4)
    # a decode step reads the weights and every live request's KV: (100 + tokens * 10) / 1000
    assert two.floor_s == pytest.approx((100 + 14 * 10) / 1000 + (100 + 16 * 10) / 1000)
    assert one.floor_s == pytest.approx((100 + 10 * 10) / 1000)


@pytest.mark.gpu
def test_gemv_benchmark_times_both_versions():
    from minisgl.benchmark import gemv

    results = gemv.run([1, 2], layers=2, reps=3)
    assert [r.rows for r in results] == [1, 2] and all(r.cublas_us > 0 and r.kernel_us > 0 for r in results)


def _committed(name: str) -> dict:
    return json.loads((ROOT / "minisgl/benchmark/results" / f"{name}.json").read_text())


@pytest.mark.parametrize("name", ["offline_h200", "decode_h200", "moe_h200", "cpu"])
def test_committed_runs_name_their_run_and_agree_with_results_md(name):
    """A committed run names its command, machine and date; the command is the one RESULTS.md shows
    and parses; and the figures chapters print from the run are the ones RESULTS.md states."""
    text = (ROOT / "minisgl/benchmark/RESULTS.md").read_text()
    run = _committed(name)
    assert run["command"] and run["machine"] and re.fullmatch(r"\d{4}-\d{2}-\d{2}", run["date"])
    assert f"`{run['command']}`" in text
    args = shlex.split(run["command"].split(" ", 3)[3] if run["command"].count(" ") >= 3 else "")  # after `python -m <module>`
    if name == "offline_h200":
        offline._parse(args)
        offline._parse(shlex.split(run["baseline"]["command"].split("benchmark.offline")[1]))
        assert f"`{run['baseline']['command']}`" in text
        figures = [f"{run['median']['output_tok_s']:,}", f"{run['floor']['seconds']} s", f"{run['floor']['output_tok_s']:,}",
                   f"| {run['baseline']['output_tok_s']} |", f"{run['baseline']['engine_on_the_same_requests_tok_s']:,} ({run['baseline']['speedup']}x)"]
        assert round(statistics.median(r["output_tok_s"] for r in run["runs"])) == run["median"]["output_tok_s"]
        assert run["floor"]["output_tok_s"] == round(run["workload"]["output_tokens"] / run["floor"]["seconds"])
    elif name == "decode_h200":
        decode.build_parser().parse_args(args)
        decode.build_parser().parse_args(shlex.split(run["graphs_on_and_off"]["command"].split("benchmark.decode")[1]))
        figures = [f"| {r['batch_size']} | {'**' * (r['batch_size'] == 1)}{r['tpot_ms']:.3f} ms{'**' * (r['batch_size'] == 1)} | {r['kernels_per_step']} | {b['tpot_ms']:.3f} ms |"
                   for r, b in zip(run["graphs_on"], run["baseline"]["graphs_on"])]
        figures += [f"{r['graphs_on_ms']} / {r['graphs_off_ms']}" for r in run["graphs_on_and_off"]["rows"]]
    elif name == "moe_h200":
        figures = [f"| {r['tokens']:,} | {r['torch_us']:,} us | {r['triton_eager_us']:,} us | {r['triton_graph_us']:,} us | {r['weights_tb_s']} TB/s |" for r in run["rows"]]
    else:
        runs = run["runs"]
        figures = [f"{a['engine_s']:.2f} / {b['engine_s']:.2f} s | {a['transformers_s']:.2f} / {b['transformers_s']:.2f} s | {a['speedup']:.2f}x / {b['speedup']:.2f}x"
                   for a, b in (runs[:2], runs[2:])]
    missing = [f for f in figures if f not in text]
    assert not missing, f"RESULTS.md does not state {missing} of results/{name}.json"


def test_every_results_quote_in_the_chapters_finds_its_text():
    """`stage4.gpu_results("...")` in a chapter quotes a section or a one-line result of RESULTS.md."""
    from file_module import load_file

    stage4 = load_file(ROOT / "chapters/stage4.py", "_stage4_under_test")
    calls = set()
    for nb in sorted((ROOT / "chapters").glob("*.ipynb")):
        for cell in json.loads(nb.read_text())["cells"]:
            calls |= {(nb.name, h) for h in re.findall(r'gpu_results\("([^"]+)"\)', "".join(cell["source"]))}
    for chapter, heading in sorted(calls):
        quoted = stage4.gpu_results(heading)
        assert not quoted.startswith("not measured"), (chapter, heading)
        assert "\n## " in quoted and heading in quoted, (chapter, heading)


def test_online_client_waits_for_a_starting_server_before_it_times_anything(capsys):
    """The online benchmark waits out a server that is not listening yet, a proxy's 503 page, then a
    server that answers "starting" (503), saying once what it waits for; one that never gets ready is
    an error."""
    import asyncio

    import httpx

    from minisgl.benchmark import online

    answers = iter([httpx.ConnectError("refused"), httpx.Response(503, text="<html>Service Unavailable</html>")]
                   + [httpx.Response(503, json={"status": "starting", "waiting_for": "the scheduler"})] * 2
                   + [httpx.Response(200, json={"status": "ok"})])
    seen = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.url.path)
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    async def wait(transport: httpx.MockTransport, timeout_s: float) -> None:
        async with httpx.AsyncClient(transport=transport) as client:
            await online.wait_until_ready(client, "http://server", timeout_s=timeout_s, poll_s=0.01)

    asyncio.run(wait(httpx.MockTransport(handler), 5))
    assert seen == ["/health"] * 5
    said = capsys.readouterr().out.splitlines()
    assert said == ["waiting for the server to listen (ConnectError)", "waiting for HTTP 503", "waiting for the scheduler"]
    never = httpx.MockTransport(lambda r: httpx.Response(503, json={"status": "starting", "waiting_for": "a model"}))
    with pytest.raises(online.ServerNotReady, match="not ready within 0 s .*waiting for a model"):
        asyncio.run(wait(never, 0.05))
