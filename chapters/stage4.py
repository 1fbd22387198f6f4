"""Figures and CPU stand-ins for chapters 16-21 (tensor parallelism, GPU attention, CUDA graphs,
kernels, mixture of experts, benchmarks).

Nothing here is engine logic: these functions draw, time or drive the engine so that the
chapters' cells stay short. Matplotlib is imported inside the drawing functions: tensor-parallel
ranks import this module too, and should not pay for it. Engine modules are imported inside the functions, so a chapter's
staged package only needs what that chapter uses.
"""

from __future__ import annotations

from pathlib import Path
from typing import Dict, List, Optional, Sequence

RANK_COLORS = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759"]
GREY, LIGHT = "#bab0ac", "#eeeeee"
REPO = Path(__file__).resolve().parents[1]


def running_on(what: str) -> str:
    """The line every GPU chapter prints so a reader knows which path ran."""
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    return f"running on {device}: {what}"


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


# ---- results of measured GPU runs --------------------------------------------------------------
RESULTS = "minisgl/benchmark/RESULTS.md"  # committed by whoever measured on a GPU; chapters never estimate


class Quoted(str):
    """Text quoted from the results file: shows as Markdown in Jupyter, as itself elsewhere."""

    def __repr__(self) -> str:
        return str(self)

    def _repr_markdown_(self) -> str:
        return str(self)


def gpu_results(heading: str, path: str = RESULTS) -> Quoted:
    """The section of the committed GPU results whose `## ` heading starts with `heading`, quoted
    with its source, or a "not measured yet" note. Chapters report GPU figures only this way."""
    file = REPO / path
    if file.is_file():
        text = file.read_text()
        title = text.splitlines()[0].lstrip("# ").strip() if text else ""
        for section in text.split("\n## ")[1:]:
            if section.startswith(heading):
                return Quoted(f"**{title}** (quoted from `{path}`)\n\n## {section.strip()}")
    return Quoted(f"not measured yet: `{path}` has no section \"{heading}\"")


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
    """The engine's torch attention backend plus the CUDA-graph hooks, so `GraphRunner.run` can be
    driven on the CPU: padding requests (beyond `batch.reqs`, up to `batch.padded_size`) read and
    write only the page table's dummy row, exactly as the FlashInfer backend arranges on GPUs."""
    from types import SimpleNamespace

    from minisgl.attention.torch_backend import TorchAttnBackend

    dummy_row = engine.page_table.shape[0] - 1

    class CpuGraphBackend(TorchAttnBackend):
        planned: dict = {}  # padded batch size -> the metadata its graph reads (a wrapper's fixed buffers on GPUs)

        def supports_cuda_graph(self) -> bool:
            return True

        def init_capture_graph(self, max_bs, bs_list) -> None:
            pass

        def _padded(self, batch) -> None:
            pad = [SimpleNamespace(table_idx=dummy_row, device_len=1, cached_len=0, extend_len=1)] * (batch.padded_size - batch.size)
            reqs, batch.reqs = batch.reqs, list(batch.reqs) + pad
            try:
                self.prepare_metadata(batch)
            finally:
                batch.reqs = reqs
            self.planned[batch.padded_size] = batch.attn_metadata

        prepare_for_capture = prepare_for_replay = _padded

    backend = CpuGraphBackend(engine.kv_cache, engine.page_table, engine.dummy_page * engine.page_size)
    engine.attn_backend = engine.ctx.attn_backend = backend
    return backend


def emulated_graph_runner(engine, max_bs: int):
    """A `GraphRunner` whose capture makes `EmulatedGraph`s instead of CUDA graphs; everything
    else (batch sizes, static buffers, padding, `run`) is the engine's own code. Installed on
    `engine`, so `engine.forward_batch` replays it for decode batches."""
    from minisgl.engine.graph import GraphRunner

    class EmulatedGraphRunner(GraphRunner):
        def _capture_all(self) -> None:
            engine, ctx = self.engine, self.engine.ctx
            engine.attn_backend.init_capture_graph(self.max_bs, self.bs_list)
            for bs in reversed(self.bs_list):
                batch = self._static_batch(bs)
                engine.attn_backend.prepare_for_capture(batch)

                def forward(batch=batch, bs=bs):
                    batch.attn_metadata = engine.attn_backend.planned[bs]  # re-planned before each replay
                    with ctx.forward_batch(batch):
                        return engine.model.forward()

                self.graphs[bs] = EmulatedGraph(forward)
                self.logits[bs] = self.graphs[bs].output

    cpu_graph_backend(engine)
    engine.graph_runner = EmulatedGraphRunner(engine, max_bs)
    return engine.graph_runner


# ---- chapter 19: kernels -----------------------------------------------------------------------
def kernel_span(path: str, name: str) -> str:
    """`"path:first-last"` of function `name` anywhere in the file (Triton kernels are defined
    inside `try:` blocks, where `book.show`'s symbol lookup does not reach), for `book.show`."""
    import ast

    from book import chapter, _stages_module

    stage = _stages_module().build(chapter())
    tree = ast.parse((stage / path).read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == name:
            first = min([node.lineno] + [d.lineno for d in node.decorator_list])
            return f"{path}:{first}-{node.end_lineno}"
    raise LookupError(f"{name} is not defined in {path}")


# ---- chapter 20: mixture of experts ------------------------------------------------------------
def blockwise_moe(x, w13, w2, topk_weights, topk_ids, aligned):
    """What the fused MoE kernel computes, tile by tile, written in PyTorch (a CPU stand-in):
    each block of `aligned.block_size` sorted rows belongs to one expert; padding rows
    (index == number of rows) are skipped; row t*top_k+k is token t's k-th choice."""
    import torch
    import torch.nn.functional as F

    from minisgl.layers.activation import silu_and_mul

    top_k, rows, bs = topk_ids.shape[1], topk_ids.numel(), aligned.block_size
    out_rows = torch.zeros(rows, x.shape[1], dtype=x.dtype)
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
