"""Figures and CPU stand-ins for chapters 16-21 (tensor parallelism, GPU attention, CUDA graphs,
kernels, mixture of experts, benchmarks).

Nothing here is engine logic: these functions draw, time or drive the engine so that the
chapters' cells stay short. Matplotlib is imported inside the drawing functions: tensor-parallel
ranks import this module too, and should not pay for it. Engine modules are imported inside the functions, so a chapter's
staged package only needs what that chapter uses.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence

RANK_COLORS = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759"]
GREY, LIGHT = "#bab0ac", "#eeeeee"
REPO = Path(__file__).resolve().parents[1]


def running_on(what: str, on_gpu: Optional[str] = None) -> str:
    """The line every GPU chapter prints so a reader knows which path ran: `what` describes the
    CPU path, `on_gpu` (default: the same text) the path taken where CUDA is present."""
    import torch

    if torch.cuda.is_available():
        return f"running on cuda ({torch.cuda.get_device_name()}): {on_gpu or what}"
    return f"running on cpu: {what}"


def ran_on() -> str:
    """The first line a `gpu` cell prints where it runs: the card, the software and the date. Such a
    cell's output is saved with the chapter (`tools/gpu_outputs.py`) and read where no GPU is, so
    it says where and when it was made."""
    import datetime
    import importlib.util

    import torch

    versions = f"torch {torch.__version__}, CUDA {torch.version.cuda}"
    if importlib.util.find_spec("flashinfer") is not None:
        import flashinfer

        versions += f", flashinfer {getattr(flashinfer, '__version__', '(version unknown)')}"
    return f"ran on {torch.cuda.get_device_name()} on {datetime.date.today().isoformat()} ({versions})"


def flashinfer_ready() -> bool:
    """CUDA present and the flashinfer package installed (`pip install minisgl[gpu]`)."""
    import importlib.util

    import torch

    return torch.cuda.is_available() and importlib.util.find_spec("flashinfer") is not None


# ---- chapter 16: tensor parallelism ------------------------------------------------------------
def _box(ax, x, y, w, h, color, text, fontsize=8):
    from matplotlib.patches import Rectangle

    ax.add_patch(Rectangle((x, y), w, h, facecolor=color, edgecolor="black", lw=0.6, alpha=0.85))
    ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=fontsize)


def _arrow(ax, x0, y0, x1, y1):
    from matplotlib.patches import FancyArrowPatch

    ax.add_patch(FancyArrowPatch((x0, y0), (x1, y1), arrowstyle="->", mutation_scale=9, lw=0.8))


def tp_mlp_figure(ranks: int = 2):
    """The MLP of one layer on `ranks` ranks: gate/up split by output rows (column-parallel),
    down split by input columns (row-parallel), one all-reduce at the end."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(11, 1.35 * ranks + 0.6))
    for r in range(ranks):
        y = (ranks - 1 - r) * 1.4
        c = RANK_COLORS[r % len(RANK_COLORS)]
        ax.text(-0.2, y + 0.4, f"rank {r}", ha="right", va="center", fontsize=9, color=c, weight="bold")
        _box(ax, 0.0, y, 1.0, 0.8, LIGHT, "x\n[T, H]\n(every rank)")
        _arrow(ax, 1.0, y + 0.4, 1.4, y + 0.4)
        _box(ax, 1.4, y, 1.6, 0.8, c, f"gate_up rows\nslice {r} of {ranks}\n(column-parallel)")
        _arrow(ax, 3.0, y + 0.4, 3.4, y + 0.4)
        _box(ax, 3.4, y, 1.3, 0.8, c, f"silu(g)*u\n[T, I/{ranks}]\n(local)")
        _arrow(ax, 4.7, y + 0.4, 5.1, y + 0.4)
        _box(ax, 5.1, y, 1.6, 0.8, c, f"down cols\nslice {r} of {ranks}\n(row-parallel)")
        _arrow(ax, 6.7, y + 0.4, 7.1, y + 0.4)
        _box(ax, 7.1, y, 1.2, 0.8, c, "partial y\n[T, H]")
        _arrow(ax, 8.3, y + 0.4, 8.9, (ranks - 1) * 0.7 + 0.4)
    _box(ax, 8.9, (ranks - 1) * 0.7, 1.3, 0.8, GREY, "all-reduce\n(sum)")
    _arrow(ax, 10.2, (ranks - 1) * 0.7 + 0.4, 10.6, (ranks - 1) * 0.7 + 0.4)
    ax.text(10.65, (ranks - 1) * 0.7 + 0.4, "y on\nevery rank", va="center", fontsize=8)
    ax.set_xlim(-0.9, 11.4)
    ax.set_ylim(-0.2, (ranks - 1) * 1.4 + 1.0)
    ax.axis("off")
    fig.tight_layout()
    return fig


def tp_device(ranks: int) -> str:
    """Where a `ranks`-way tensor-parallel demo runs: one GPU per rank, or else every rank on the
    CPU (gloo all-reduces), since two ranks cannot share one GPU's NCCL communicator."""
    import torch

    return "cuda" if torch.cuda.device_count() >= ranks else "cpu"


def tp_note(ranks: int) -> str:
    """Says where the ranks of a `ranks`-way demo run, and why."""
    import torch

    gpus = torch.cuda.device_count()
    if gpus >= ranks:
        return (f"running on cuda: rank 0 on cuda:0 is this process, ranks 1..{ranks - 1} spawned ones on "
                f"cuda:1..{ranks - 1}; NCCL all-reduces")
    what = "rank 0 is this process, rank 1 a spawned one; gloo all-reduces"
    if gpus == 0:
        return f"running on cpu: {what}"
    return (f"running on cpu: tensor parallelism over {ranks} ranks needs {ranks} GPUs and this machine has "
            f"{gpus}, so every rank runs on the CPU ({what})")


def shard_table(models: Dict[str, object], names: Sequence[str]) -> str:
    """Shapes of the same parameter in several models (e.g. TP=1, rank 0 of 2, rank 1 of 2)."""
    from figures import table

    rows = []
    for name in names:
        row = {"parameter": name}
        for label, model in models.items():
            row[label] = "x".join(str(s) for s in model.state_dict()[name].shape)
        rows.append(row)
    return table(rows)


# ---- results of measured runs -----------------------------------------------------------------
RESULTS = "minisgl/benchmark/RESULTS.md"  # committed by whoever measured; chapters never estimate
RESULTS_DIR = "minisgl/benchmark/results"  # the same figures, one JSON file per benchmark run


class Quoted(str):
    """Text quoted from the results file: shows as Markdown in Jupyter, as itself elsewhere."""

    def __repr__(self) -> str:
        return str(self)

    def _repr_markdown_(self) -> str:
        return str(self)


def measured(name: str) -> dict:
    """The committed figures of one benchmark run, `minisgl/benchmark/results/<name>.json`: the
    figure, the baseline measured in the same run, and the `command`, `machine` and `date`."""
    import json

    file = REPO / RESULTS_DIR / f"{name}.json"
    if not file.is_file():
        known = sorted(f.stem for f in (REPO / RESULTS_DIR).glob("*.json"))
        raise FileNotFoundError(f"no committed results named {name!r} in {RESULTS_DIR}/ (there are: {', '.join(known)})")
    return json.loads(file.read_text())


def measured_where(run: dict) -> str:
    """Where a committed figure comes from, as a chapter prints it under the figure."""
    return f"measured on {run['machine']} on {run['date']}: `{run['command']}`"


def gpu_results(heading: str, path: str = RESULTS) -> Quoted:
    """Quotes the committed results: the `## ` section whose heading starts with `heading`, or else
    the one-line result `- **heading...` with the opening paragraph of its section (which names
    the machine and dates); a "not measured" note when neither is there."""
    file = REPO / path
    if file.is_file():
        text = file.read_text()
        title = text.splitlines()[0].lstrip("# ").strip() if text else ""
        source = f"**{title}** (quoted from `{path}`)"
        sections = text.split("\n## ")[1:]
        for section in sections:
            if section.startswith(heading):
                return Quoted(f"{source}\n\n## {section.strip()}")
        for section in sections:
            name, *paragraphs = section.strip().split("\n\n")
            for group in paragraphs[1:]:  # a label line ("Kept in the engine:"), then one line per result
                lines = [line for line in group.splitlines() if line.startswith(f"- **{heading}")]
                if lines:
                    label = group.splitlines()[0]
                    return Quoted(f"{source}\n\n## {name}\n\n{paragraphs[0]}\n\n{label}\n{lines[0]}")
    return Quoted(f"not measured: `{path}` has no section or line \"{heading}\"")


def tried_not_kept(*names: str, path: str = RESULTS) -> Quoted:
    """The entries of the results file's "Tried and not kept:" list that contain one of `names`
    (each entry as committed, with its measured outcome), one a line; raises when one is missing,
    so a chapter cannot cite an idea the results do not list."""
    text = (REPO / path).read_text()
    start = text.index("Tried and not kept:") + len("Tried and not kept:")
    paragraph = " ".join(text[start:].split("\n\n")[0].split())
    entries = [e.strip().rstrip(".") for e in paragraph.split(";")]
    found = []
    for name in names:
        hits = [e for e in entries if name in e]
        if not hits:
            raise ValueError(f"{path} lists nothing tried and not kept that mentions {name!r}")
        found += [h for h in hits if h not in found]
    return Quoted(f"tried and not kept (`{path}`):\n" + "\n".join(f"- {e}" for e in found))


# ---- chapter 17: FlashInfer's page list -------------------------------------------------------
def page_list_figure(kv_indptr: Sequence[int], kv_indices: Sequence[int], kv_last_page_len: Sequence[int],
                     page_size: int, title: str = ""):
    """The CSR page list as FlashInfer reads it: the entries of `kv_indices` end to end, each a page
    of `page_size` slots (filled slots coloured by request, the unused end of a last page left
    blank), with each request's span `kv_indptr[i] : kv_indptr[i + 1]` marked below."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    total, gap = len(kv_indices), 0.4
    width = page_size + gap
    fig, ax = plt.subplots(figsize=(min(14, 0.32 * total * width + 1.5), 2.0))
    for i in range(len(kv_indptr) - 1):
        color = RANK_COLORS[i % len(RANK_COLORS)]
        first, end = kv_indptr[i], kv_indptr[i + 1]
        for k in range(first, end):
            x = k * width
            used = kv_last_page_len[i] if k == end - 1 else page_size
            for s in range(page_size):
                ax.add_patch(Rectangle((x + s, 0), 1, 1, facecolor=color if s < used else "white",
                                       edgecolor="black", lw=0.4, hatch=None if s < used else "//"))
            ax.text(x + page_size / 2, 1.25, f"page {int(kv_indices[k])}", ha="center", fontsize=7)
        left, right = first * width, end * width - gap
        ax.plot([left, right], [-0.35, -0.35], color=color, lw=2.5)
        ax.text((left + right) / 2, -0.85, f"request {i}: kv_indptr[{i}:{i + 2}] = {kv_indptr[i]}, {kv_indptr[i + 1]}; "
                f"last page {kv_last_page_len[i]}/{page_size}", ha="center", fontsize=7)
    ax.set_xlim(-0.5, total * width), ax.set_ylim(-1.2, 1.6), ax.axis("off")
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    return fig


# ---- chapter 18: CUDA graphs, emulated on the CPU ----------------------------------------------
class EmulatedGraph:
    """Stands in for `torch.cuda.CUDAGraph` where there is no GPU. A real graph records kernels
    reading and writing fixed addresses and replays them without Python; this one records a
    function reading the same static buffers, and replay reruns it into the same output tensor.
    It keeps the graph's *contract* (fixed shapes, fixed buffers in and out) and none of its speed."""

    def __init__(self, fn):
        self._fn = fn
        self.output = fn()  # "capture": the output tensor is fixed from now on

    def replay(self) -> None:
        self.output.copy_(self._fn())


def cpu_graph_backend(engine):
    """The engine's torch attention backend, as a class with CUDA-graph support registered
    (`minisgl.attention.graph_support`), so `GraphRunner.run` can be driven on the CPU: padding
    requests (beyond `batch.reqs`, up to the size the runner replays) read and write only the page
    table's dummy row, exactly as FlashInfer's graph support arranges on GPUs. The torch backend
    itself registers none: an engine never captures it."""
    from types import SimpleNamespace

    from minisgl.attention.graph_support import AttnGraphSupport, graph_support, padded_rows
    from minisgl.attention.torch_backend import TorchAttnBackend

    class CpuGraphBackend(TorchAttnBackend):
        pass

    @graph_support(CpuGraphBackend)
    class CpuGraphSupport(AttnGraphSupport):
        def __init__(self, backend, max_bs, bs_list):
            self.backend = backend
            self.planned: dict = {}  # padded batch size -> the metadata its graph reads (fixed buffers on GPUs)

        def prepare_for_replay(self, batch, size: int) -> None:
            rows, kv_lens = padded_rows(batch, size, self.backend.page_table.shape[0] - 1)  # the dummy row
            pad = [SimpleNamespace(table_idx=row, device_len=n, cached_len=0, extend_len=1)
                   for row, n in zip(rows[batch.size :], kv_lens[batch.size :])]
            reqs, batch.reqs = batch.reqs, list(batch.reqs) + pad
            try:
                self.backend.prepare_metadata(batch)
            finally:
                batch.reqs = reqs
            self.planned[size] = batch.attn_metadata

    backend = CpuGraphBackend(engine.kv_cache, engine.page_table, engine.dummy_page * engine.page_size)
    engine.attn_backend = engine.ctx.attn_backend = backend
    return backend


def emulated_graph_runner(engine, max_bs: int):
    """A `GraphRunner` whose capture makes `EmulatedGraph`s instead of CUDA graphs; everything
    else (batch sizes, static buffers, the backend's graph support, padding, `run`) is the
    engine's own code. Installed on `engine`, so `engine.forward_batch` replays it for decode
    batches."""
    from minisgl.engine.graph import GraphRunner

    class EmulatedGraphRunner(GraphRunner):
        def _capture_all(self) -> None:
            engine, ctx = self.engine, self.engine.ctx
            for bs in reversed(self.bs_list):
                batch = self._static_batch(bs)
                self.attn_support.prepare_for_capture(batch, bs)

                def forward(batch=batch, bs=bs):
                    batch.attn_metadata = self.attn_support.planned[bs]  # re-planned before each replay
                    with ctx.forward_batch(batch):
                        return engine.model.forward()

                self.graphs[bs] = EmulatedGraph(forward)
                self.logits[bs] = self.graphs[bs].output

    cpu_graph_backend(engine)
    engine.graph_runner = EmulatedGraphRunner(engine, max_bs)
    return engine.graph_runner


# ---- chapter 20: mixture of experts ------------------------------------------------------------
def blockwise_moe(x, w13, w2, topk_weights, topk_ids, aligned):
    """What the fused MoE kernel computes, tile by tile, written in PyTorch (a CPU stand-in):
    each block of `aligned.block_size` sorted rows belongs to one expert; padding rows
    (index == number of rows) are skipped; row t*top_k+k is token t's k-th choice."""
    import torch
    import torch.nn.functional as F

    from minisgl.layers.activation import silu_and_mul

    top_k, rows, bs = topk_ids.shape[1], topk_ids.numel(), aligned.block_size
    out_rows = torch.zeros(rows, x.shape[1], dtype=x.dtype, device=x.device)
    flat_w = topk_weights.flatten()
    for b in range(int(aligned.num_padded) // bs):
        e = int(aligned.expert_ids[b])
        ids = aligned.sorted_ids[b * bs : (b + 1) * bs].long()
        real = ids[ids < rows]
        h = silu_and_mul(F.linear(x[real // top_k], w13[e]))
        out_rows[real] = F.linear(h, w2[e]) * flat_w[real, None].to(x.dtype)
    return out_rows.view(-1, top_k, x.shape[1]).sum(1)


def aligned_figure(aligned, num_rows: int, title: str = ""):
    """The sorted row list as tiles: each block coloured by its expert, padding hatched."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    bs, n = aligned.block_size, int(aligned.num_padded)
    fig, ax = plt.subplots(figsize=(min(14, 0.42 * n + 1), 1.4))
    for i in range(n):
        e = int(aligned.expert_ids[i // bs])
        row = int(aligned.sorted_ids[i])
        pad = row == num_rows
        ax.add_patch(Rectangle((i, 0), 1, 1, facecolor=LIGHT if pad else RANK_COLORS[e % len(RANK_COLORS)] if e < 4 else f"C{e}",
                               edgecolor="black", lw=0.4, hatch="//" if pad else None))
        ax.text(i + 0.5, 0.5, "pad" if pad else str(row), ha="center", va="center", fontsize=7)
    for b in range(n // bs):
        ax.text(b * bs + bs / 2, 1.15, f"expert {int(aligned.expert_ids[b])}", ha="center", fontsize=8)
        ax.axvline(b * bs, color="black", lw=1.5)
    ax.set_xlim(0, n), ax.set_ylim(0, 1.45), ax.axis("off")
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    return fig


# ---- on a GPU: the real thing beside the CPU stand-ins -----------------------------------------
_NEEDS_FLASHINFER = "not run here: it needs CUDA and the flashinfer package (pip install -e '.[gpu]')"
_GPU_PROMPTS = [[1, 504, 3458, 282], [9, 8, 7, 6, 5, 4], [600, 601], [42] * 11]


def _generate_timed(llm, prompts, max_tokens: int):
    """Greedy token ids of `prompts` and the seconds of a second (warm) run: the first run pays
    for kernel compilation and graph capture."""
    import time

    import torch
    from minisgl.core import SamplingParams

    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    llm.generate(prompts, params)
    torch.cuda.synchronize()
    start = time.perf_counter()
    tokens = [o.token_ids for o in llm.generate(prompts, params)]
    torch.cuda.synchronize()
    return tokens, time.perf_counter() - start


def _agreement(a, b) -> str:
    same = sum(x == y for ta, tb in zip(a, b) for x, y in zip(ta, tb))
    return f"{same}/{sum(len(t) for t in a)} tokens agree, {sum(ta == tb for ta, tb in zip(a, b))}/{len(a)} requests identical"


def _eager() -> Dict[str, bool]:
    """The setting that makes every step run eagerly: CUDA graphs off, where the package has them
    (chapter 18 brings them with their settings; chapter 17's stage has neither)."""
    import dataclasses

    from minisgl.engine import EngineConfig

    return {"use_cuda_graph": False} if "use_cuda_graph" in {f.name for f in dataclasses.fields(EngineConfig)} else {}


def _gpu_llm(**kw):
    from book import default_model_path
    from minisgl.llm import LLM

    return LLM(str(default_model_path()), max_running_reqs=8, max_seq_len=256, **kw)


def flashinfer_against_torch(max_tokens: int = 16) -> str:
    """On CUDA with FlashInfer: the default model (SmolLM2-135M: bfloat16, head_dim 64) generates
    the same greedy requests with the FlashInfer backend and with the torch backend (both eager).
    The two round differently in bfloat16, so a near-tie may flip a token and the rest of that
    request then differs; elsewhere, says why nothing ran."""
    if not flashinfer_ready():
        return _NEEDS_FLASHINFER
    import torch

    runs = {}
    for backend in ("flashinfer", "torch"):
        llm = _gpu_llm(attention_backend=backend, **_eager())
        name = type(llm.engine.attn_backend).__name__
        runs[backend] = (*_generate_timed(llm, _GPU_PROMPTS, max_tokens), name)
        del llm
        torch.cuda.empty_cache()
    (fi, fi_s, fi_name), (tb, tb_s, tb_name) = runs["flashinfer"], runs["torch"]
    return (f"{ran_on()}\nbfloat16: {fi_name} {fi_s * 1e3:.0f} ms, {tb_name} {tb_s * 1e3:.0f} ms for "
            f"{len(_GPU_PROMPTS)} requests x {max_tokens} tokens; {_agreement(fi, tb)}")


@dataclass
class StepTimes:
    """One attention backend's step times for one batch: `batch_size` fresh prompts prefilled
    together, then decoded together."""

    backend: str  # the class that attended, e.g. FlashInferAttnBackend
    batch_size: int
    prompt_len: int
    prefill_s: float  # the prefill step of the whole batch
    decode_s: float  # the median decode step


def _sync(llm) -> None:
    import torch

    if llm.device.type == "cuda":
        torch.cuda.synchronize(llm.device)


def _timed_steps(llm, batch_size: int, prompt_len: int, decode_steps: int, seed: int):
    """Seconds of each prefill step and of each decode step while `batch_size` fresh prompts of
    `prompt_len` random token ids each generate `1 + decode_steps` tokens. Overlap is off in the
    engines this is given, so a step launches one batch and reads its tokens before returning."""
    import random
    import time

    from minisgl.core import SamplingParams

    rng = random.Random(seed)
    params = SamplingParams(max_tokens=1 + decode_steps, ignore_eos=True)
    uids = [llm.add_request([rng.randint(100, 10000) for _ in range(prompt_len)], params) for _ in range(batch_size)]
    times: Dict[str, List[float]] = {"prefill": [], "decode": []}
    while not llm.is_idle:
        launched = len(llm.trace)
        _sync(llm)
        start = time.perf_counter()
        llm.step()
        _sync(llm)
        took = time.perf_counter() - start
        phases = {t.phase for t in llm.trace[launched:]}
        if len(phases) == 1:
            times[phases.pop()].append(took)
    for uid in uids:
        llm.take_output(uid)
    return times["prefill"], times["decode"]


def backend_step_times(backend: str, batch_sizes: Sequence[int] = (1, 8, 32), prompt_len: int = 512,
                       decode_steps: int = 32, model: Optional[str] = None, **options) -> List[StepTimes]:
    """The prefill step and the median decode step of the attention backend named `backend`, one
    engine for every batch size, both eager (the torch backend has no CUDA graphs). Each batch
    size runs twice, the first time untimed: kernels are compiled and memory taken then. Nothing is
    reused between prompts (`prefix_cache="naive"`), so every prefill computes its whole prompt.
    `options`: other engine settings by name (`dtype="float32"`)."""
    import gc
    import statistics

    import torch
    from minisgl.core import set_global_ctx
    from minisgl.engine import EngineConfig
    from minisgl.llm import LLM

    if decode_steps < 1 or prompt_len < 1 or min(batch_sizes) < 1:
        raise ValueError(f"batch sizes, prompt_len and decode_steps must be at least 1; got {list(batch_sizes)}, "
                         f"{prompt_len}, {decode_steps}")
    if model is None:
        from book import default_model_path

        model = str(default_model_path())
    max_bs, max_len = max(batch_sizes), prompt_len + decode_steps + 8
    page = options.get("page_size", EngineConfig.page_size)
    llm = LLM(model, attention_backend=backend, **_eager(), overlap=False, prefix_cache="naive",
              max_running_reqs=max_bs, max_seq_len=max_len, num_pages=max_bs * (max_len + page) // page + 16, **options)
    try:
        if max_bs * prompt_len > llm.config.max_extend_tokens:
            raise ValueError(f"{max_bs} prompts of {prompt_len} tokens would be prefilled over several steps (the "
                             f"budget is {llm.config.max_extend_tokens} tokens a step): pass smaller batch sizes or "
                             "prompts, or a larger max_extend_tokens")
        name = type(llm.engine.attn_backend).__name__
        rows = []
        for i, bs in enumerate(batch_sizes):
            _timed_steps(llm, bs, prompt_len, decode_steps, seed=2 * i)
            prefill, decode = _timed_steps(llm, bs, prompt_len, decode_steps, seed=2 * i + 1)
            rows.append(StepTimes(name, bs, prompt_len, sum(prefill), statistics.median(decode)))
        return rows
    finally:
        llm.shutdown()
        set_global_ctx(None)
        del llm
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def step_times_table(runs: Dict[str, List[StepTimes]]) -> str:
    """Milliseconds per prefill step and per decode step, one row per batch size and backend, each
    also as a multiple of the first backend's time for the same batch."""
    from figures import table

    first = next(iter(runs.values()))
    rows = []
    for i, base in enumerate(first):
        for name, times in runs.items():
            t = times[i]
            rows.append({"batch": t.batch_size, "backend": name,
                         "prefill ms": f"{t.prefill_s * 1e3:.2f}", "decode ms": f"{t.decode_s * 1e3:.2f}",
                         "prefill x": f"{t.prefill_s / base.prefill_s:.2f}",
                         "decode x": f"{t.decode_s / base.decode_s:.2f}"})
    return table(rows)


def step_times_figure(runs: Dict[str, List[StepTimes]], title: str = ""):
    """Two panels, the prefill step and the decode step, in milliseconds against the batch size,
    one bar per backend."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.2))
    width = 0.8 / len(runs)
    for ax, phase in zip(axes, ("prefill", "decode")):
        for k, (name, rows) in enumerate(runs.items()):
            xs = [i + (k - (len(runs) - 1) / 2) * width for i in range(len(rows))]
            ax.bar(xs, [getattr(r, f"{phase}_s") * 1e3 for r in rows], width, label=name,
                   color=RANK_COLORS[k % len(RANK_COLORS)])
        first = next(iter(runs.values()))
        ax.set_xticks(range(len(first)), [str(r.batch_size) for r in first])
        ax.set_xlabel(f"batch size (prompts of {first[0].prompt_len} tokens)")
        ax.set_ylabel("ms per step")
        ax.set_title(f"one {phase} step" + (" (median)" if phase == "decode" else ""), fontsize=9)
        ax.legend(fontsize=8)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    return fig


def flashinfer_step_times(batch_sizes: Sequence[int] = (1, 8, 32), prompt_len: int = 512,
                          decode_steps: int = 32) -> str:
    """On CUDA with FlashInfer: the prefill step and the decode step of the default model
    (SmolLM2-135M, bfloat16) with the FlashInfer backend and with the torch backend, same batches,
    as a table (returned) and a figure (drawn); elsewhere, says why nothing ran."""
    if not flashinfer_ready():
        return _NEEDS_FLASHINFER
    runs = {b: backend_step_times(b, batch_sizes, prompt_len, decode_steps) for b in ("flashinfer", "torch")}
    stamp = ran_on()
    step_times_figure(runs, stamp)
    first = runs["flashinfer"][0]
    return (f"{stamp}\n{first.prompt_len}-token prompts, eager, the GPU synchronized around each step "
            f"(x: times FlashInfer's):\n{step_times_table(runs)}")


def cuda_graphs_against_eager(max_tokens: int = 16) -> str:
    """On CUDA with FlashInfer: the default model generates the same greedy requests with decode
    steps replayed from real CUDA graphs and eagerly; the graphs run the same kernels on the same
    buffers, so the tokens must be identical. Elsewhere, says why nothing ran."""
    if not flashinfer_ready():
        return _NEEDS_FLASHINFER
    import torch

    runs = {}
    for graphs in (True, False):
        llm = _gpu_llm(use_cuda_graph=graphs)
        runner = llm.engine.graph_runner
        captured = sorted(runner.graphs) if runner is not None else []
        runs[graphs] = (*_generate_timed(llm, _GPU_PROMPTS, max_tokens), captured)
        del llm, runner
        torch.cuda.empty_cache()
    (g, g_s, sizes), (e, e_s, _) = runs[True], runs[False]
    return (f"{ran_on()}\n{len(sizes)} CUDA graphs captured (batch sizes {sizes}); "
            f"graphs {g_s * 1e3:.0f} ms, eager {e_s * 1e3:.0f} ms for {len(_GPU_PROMPTS)} requests x {max_tokens} tokens; "
            f"same tokens: {g == e}")


def triton_moe_against_torch(x, w13, w2, topk_weights, topk_ids) -> str:
    """On CUDA: the Triton fused-MoE kernel against the loop over experts (float64 reference),
    in float32 and bfloat16; elsewhere, says why nothing ran."""
    import torch

    from minisgl.moe import moe_forward_torch

    if not torch.cuda.is_available():
        return "not run here: the Triton kernel needs CUDA"
    from minisgl.moe.triton_moe import fused_moe

    dev = torch.device("cuda")
    args = [t.to(dev) for t in (x, w13, w2, topk_weights)]
    ids = topk_ids.to(dev)
    want = moe_forward_torch(*[t.double() for t in args[:3]], args[3].double(), ids)
    parts = []
    for dtype in (torch.float32, torch.bfloat16):
        xs, a, b, w = (t.to(dtype) for t in args)
        got = fused_moe(xs, a, b, w, ids).double()
        parts.append(f"{str(dtype).removeprefix('torch.')} relative error {((got - want).abs().max() / want.abs().max()).item():.1e}")
    return f"{ran_on()}\nTriton fused_moe against the loop over experts: " + ", ".join(parts)


def interpreted(code: str, timeout: int = 300) -> str:
    """What `code` prints when a fresh Python runs it under Triton's interpreter (`TRITON_INTERPRET=1`,
    set before Triton loads, so the kernels run on CPU tensors) with this notebook's `minisgl`; without
    Triton, says why it did not run."""
    import importlib.util
    import subprocess
    import sys

    import minisgl
    from minisgl.env import child_environment

    if importlib.util.find_spec("triton") is None:
        return "not run here: Triton is not installed"
    env = {**child_environment(Path(minisgl.__file__).resolve().parents[1]), "TRITON_INTERPRET": "1"}
    env.pop("MINISGL_DISABLE_KERNELS", None)
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=timeout)
    return run.stdout.strip() if run.returncode == 0 else "failed: " + run.stderr.strip()[-800:]


def kernels_against_layers(tokens: int = 37) -> str:
    """On CUDA with Triton: every kernel of `minisgl.kernel` against the plain PyTorch it replaces (a
    layer's forward, or the plain store and page list) on the same random CUDA inputs, in bfloat16 with
    SmolLM2-135M's shapes (hidden 576, 9 query and 3 KV heads of 64); the value is the largest
    difference (0 means bit for bit). Elsewhere, says why."""
    import torch
    import torch.nn.functional as F

    from minisgl import kernel as K
    from minisgl.layers.activation import silu_and_mul
    from minisgl.layers.norm import RMSNorm
    from minisgl.layers.rotary import RotaryEmbedding

    if not (torch.cuda.is_available() and K.triton_available()):
        return "not run here: the Triton kernels need CUDA (and Triton)"
    dev, bf = torch.device("cuda"), torch.bfloat16
    g = torch.Generator(device=dev).manual_seed(0)
    rand = lambda *shape: torch.randn(*shape, generator=g, device=dev).to(bf)  # noqa: E731
    x, res, w = rand(tokens, 576), rand(tokens, 576), rand(576)
    qkv = rand(tokens, (9 + 3 + 3) * 64)
    q, k, v = qkv[:, : 9 * 64].reshape(tokens, 9, 64), qkv[:, 9 * 64 : 12 * 64].reshape(tokens, 3, 64), qkv[:, 12 * 64 :].reshape(tokens, 3, 64)
    pos = torch.randperm(1024, generator=g, device=dev)[:tokens]
    rope = RotaryEmbedding(64, 1024, 100000.0, None, dev)  # SmolLM2's
    norm = RMSNorm(576, 1e-5, dtype=bf, device=dev)
    norm.weight.copy_(w)
    slots = torch.randperm(512, generator=g, device=dev)[:tokens].to(torch.int32)

    def diff(a, b) -> float:
        pairs = zip(a, b) if isinstance(a, tuple) else [(a, b)]
        return max((p.float() - r.float()).abs().max().item() for p, r in pairs)

    def stored(fn):
        caches = torch.zeros(2, 512, 3, 64, dtype=bf, device=dev)
        fn(k, v, caches[0], caches[1], slots)  # v is strided, as it comes out of qkv_proj
        return caches[0], caches[1]

    table = torch.randint(0, 4096, (6, 256), generator=g, device=dev, dtype=torch.int32)
    rows = torch.tensor([4, 0, 5], device=dev)
    indptr = torch.tensor([0, 3, 3, 7], dtype=torch.int32, device=dev)
    proj = rand(2 * 1536, 576) / 24  # SmolLM2's gate|up shape, scaled so outputs stay near 1
    checks = {
        "rmsnorm": diff(K.rmsnorm(x, w, 1e-5), norm.forward(x)),
        "fused_add_rmsnorm": diff(K.fused_add_rmsnorm(x, res, w, 1e-5), norm.forward_residual(x, res)),
        "silu_and_mul": diff(K.silu_and_mul(qkv[:, :1152]), silu_and_mul(qkv[:, :1152])),
        "apply_rope": diff(K.apply_rope(pos, q, k, rope.cos, rope.sin), rope.forward(pos, q, k)),
        "store_kv": diff(stored(K.store_kv), stored(K.store_kv_ref)),
        "gather_page_indices": diff(K.gather_page_indices(table, rows, indptr, 4, 7, max_pages=4), K.gather_page_indices_ref(table, rows, indptr, 4, 7)),
        # one row, as a batch-1 decode step has; the plain layer's product is cuBLAS (F.linear)
        "linear": diff(K.linear(x[:1], proj), F.linear(x[:1], proj)),
        "linear_silu_and_mul": diff(K.linear_silu_and_mul(x[:1], proj), silu_and_mul(F.linear(x[:1], proj))),
    }
    return "running on cuda, Triton against the plain PyTorch (largest difference):\n" + "\n".join(
        f"  {name:<20} {d:.3g}" + ("  (bit for bit)" if d == 0 else "") for name, d in checks.items())
