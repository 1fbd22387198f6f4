"""Figures for chapters 00-05. Drawing only: every number drawn comes from the caller."""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence

import matplotlib.pyplot as plt
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

BLUE, ORANGE, GREEN, GREY, RED, PURPLE = "#4e79a7", "#f28e2b", "#59a14f", "#d9d9d9", "#e15759", "#b07aa1"
REQ_COLORS = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#b07aa1", "#76b7b2", "#edc948", "#9c755f"]


def _box(ax, x, y, w, h, text, color, fontsize=9):
    ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.02,rounding_size=0.08",
                                facecolor=color, edgecolor="#333", linewidth=0.8, alpha=0.9))
    ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=fontsize)


def _arrow(ax, a, b, text="", color="#333"):
    ax.add_patch(FancyArrowPatch(a, b, arrowstyle="-|>", mutation_scale=12, color=color, linewidth=1))
    if text:
        ax.text((a[0] + b[0]) / 2, (a[1] + b[1]) / 2 + 0.12, text, ha="center", fontsize=7.5, color="#555")


def request_path():
    """The path of one request through a serving engine, with the chapter that builds each part."""
    fig, ax = plt.subplots(figsize=(11, 3.6))
    ax.set_xlim(0, 11), ax.set_ylim(0, 3.6), ax.axis("off")
    _box(ax, 0.1, 2.4, 1.5, 0.8, "client\n(HTTP / LLM)", GREY)
    _box(ax, 2.1, 2.4, 1.6, 0.8, "tokenizer\nch 13", "#cfe2f3")
    _box(ax, 4.3, 2.4, 2.0, 0.8, "scheduler\nch 7-11, 14", "#fde9c9")
    _box(ax, 4.3, 0.3, 2.0, 1.2, "engine  ch 6\nmodel ch 2-3\nattention ch 5", "#d9ead3")
    _box(ax, 7.0, 0.3, 1.7, 1.2, "KV pool +\npage table\nch 4", "#d9ead3")
    _box(ax, 7.0, 2.4, 1.7, 0.8, "detokenizer\nch 13", "#cfe2f3")
    _box(ax, 9.3, 2.4, 1.5, 0.8, "text\nstreams back", GREY)
    _arrow(ax, (1.6, 2.8), (2.1, 2.8), "prompt")
    _arrow(ax, (3.7, 2.8), (4.3, 2.8), "token ids")
    _arrow(ax, (5.0, 2.4), (5.0, 1.5), "batch")
    _arrow(ax, (5.6, 1.5), (5.6, 2.4), "next tokens")
    _arrow(ax, (6.3, 0.9), (7.0, 0.9), "")
    _arrow(ax, (6.3, 2.8), (7.0, 2.8), "token ids")
    _arrow(ax, (8.7, 2.8), (9.3, 2.8), "")
    ax.text(5.3, 1.95, "once per step", fontsize=7.5, color="#555", ha="center", rotation=0)
    ax.set_title("One request's path; the numbers are the chapters that build each part", fontsize=10)
    fig.tight_layout()
    return fig


def step_times(series: Dict[str, Sequence[float]], title: str):
    """Milliseconds per generated token, one line per variant."""
    fig, ax = plt.subplots(figsize=(7, 3))
    for (name, ys), color in zip(series.items(), [BLUE, ORANGE, GREEN]):
        ax.plot(range(1, len(ys) + 1), ys, marker="o", markersize=3, label=name, color=color)
    ax.set_xlabel("generated token"), ax.set_ylabel("ms"), ax.set_title(title, fontsize=10)
    ax.set_ylim(bottom=0), ax.legend(frameon=False), ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def cost_vs_length(lengths: Sequence[int], series: Dict[str, Sequence[float]], title: str):
    """Milliseconds for one step against the number of tokens already in the sequence."""
    fig, ax = plt.subplots(figsize=(7, 3))
    for (name, ys), color in zip(series.items(), [ORANGE, BLUE, GREEN]):
        ax.plot(lengths, ys, marker="o", label=name, color=color)
    ax.set_xlabel("tokens in the sequence"), ax.set_ylabel("ms for the next token")
    ax.set_title(title, fontsize=10), ax.set_ylim(bottom=0), ax.legend(frameon=False), ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def text_table(rows: Sequence[Dict[str, object]]) -> str:
    """A fixed-width table as text: stable, so a notebook can check it verbatim."""
    cols = list(rows[0])
    cells = [[str(r[c]) for c in cols] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
    fmt = lambda vals: "  ".join(v.rjust(w) for v, w in zip(vals, widths))  # noqa: E731
    return "\n".join([fmt(cols), fmt(["-" * w for w in widths])] + [fmt(r) for r in cells])


def ledger_bar(row: Dict[str, object], ax=None):
    """One request's positions coloured by the ledger: cached, pending for the next pass, room left.
    The lower strip marks the positions whose token *value* the host already has."""
    cached, device, top, host = (int(row[k]) for k in ("cached_len", "device_len", "max_device_len", "on_host"))
    if ax is None:
        fig, ax = plt.subplots(figsize=(8, 1.9))
    ax.clear()
    for start, end, color, label in [(0, cached, GREEN, "cached (KV in the pool)"),
                                     (cached, device, ORANGE, "extend: computed by the next pass"),
                                     (device, top, GREY, "remain: room to generate")]:
        if end > start:
            ax.barh(1, end - start, left=start, color=color, edgecolor="white", label=label, height=0.7)
    ax.barh(0, host, left=0, color=BLUE, height=0.5, label="token value known on the host")
    ax.set_yticks([0, 1], ["host", "ledger"]), ax.set_xlim(0, top), ax.set_ylim(-0.5, 1.5)
    ax.set_xticks(range(0, top + 1, 2)), ax.set_xlabel("position")
    ax.set_title(str(row["event"]), fontsize=10, loc="left")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False, fontsize=8)
    ax.figure.tight_layout()
    return ax.figure


def _matrix(ax, x, y, w, h, splits, axis, colors, labels=None, title=""):
    """A weight matrix drawn as a rectangle cut into per-rank pieces along rows or columns."""
    total, pos = sum(splits), 0
    for i, s in enumerate(splits):
        if axis == "rows":  # output features: top to bottom
            rect = (x, y + h - (pos + s) / total * h, w, s / total * h)
        else:  # input features: left to right
            rect = (x + pos / total * w, y, s / total * w, h)
        ax.add_patch(plt.Rectangle(rect[:2], rect[2], rect[3], facecolor=colors[i], edgecolor="white", linewidth=1.5))
        if labels:
            ax.text(rect[0] + rect[2] / 2, rect[1] + rect[3] / 2, labels[i], ha="center", va="center", fontsize=7.5, color="white")
        pos += s
    ax.text(x + w / 2, y + h + 0.15, title, ha="center", fontsize=8.5)


def tp_sharding(q_heads: int = 9, kv_heads: int = 3, tp: int = 3):
    """How the three kinds of parallel linear layer cut their weight `[out, in]` over `tp` ranks."""
    rank_colors = REQ_COLORS[:tp]
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.6))
    for ax in axes:
        ax.set_xlim(0, 4), ax.set_ylim(0, 4.2), ax.axis("off")
    _matrix(axes[0], 0.8, 0.4, 1.6, 3.2, [1] * tp, "rows", rank_colors, [f"rank {r}" for r in range(tp)],
            "column-parallel (q|k|v, gate|up)\noutput rows split")
    axes[0].text(2.6, 2.0, "each rank: its slice\nof the output,\nno communication", fontsize=8, va="center")
    _matrix(axes[1], 0.4, 1.2, 2.4, 1.6, [1] * tp, "cols", rank_colors, [f"r{r}" for r in range(tp)],
            "row-parallel (o_proj, down_proj)\ninput columns split")
    axes[1].text(1.6, 0.6, "each rank: a partial sum\nof the whole output -> all-reduce", fontsize=8, ha="center")
    per_q, per_kv = q_heads // tp, max(kv_heads // tp, 1)
    splits, colors, labels = [], [], []
    for part, heads in (("q", per_q), ("k", per_kv), ("v", per_kv)):
        for r in range(tp):
            splits.append(heads)
            colors.append(rank_colors[r])
            labels.append(f"{part} r{r}")
    _matrix(axes[2], 0.8, 0.2, 1.6, 3.6, splits, "rows", colors, labels,
            f"QKV merged, {q_heads} q / {kv_heads} kv heads\nover {tp} ranks")
    axes[2].text(2.6, 2.0, "rank r keeps its q heads\nand the kv heads they\nattend to (rows gathered\nfrom three places)", fontsize=8, va="center")
    fig.tight_layout()
    return fig


def rope_table(cos, title: str):
    """cos(position * frequency) as an image: fast pairs on the left, slow pairs on the right."""
    fig, ax = plt.subplots(figsize=(8, 3))
    im = ax.imshow(cos.T, aspect="auto", cmap="RdBu", vmin=-1, vmax=1, origin="lower")
    ax.set_xlabel("position"), ax.set_ylabel("channel pair (fast -> slow)"), ax.set_title(title, fontsize=10)
    fig.colorbar(im, ax=ax, fraction=0.03)
    fig.tight_layout()
    return fig


def occupancy(snapshots: Sequence[Dict[str, List[int]]], num_slots: int, steps: Sequence[int], cols: int = 10):
    """The pool's slots at a few steps, coloured by the request that owns them (grey: free)."""
    names = sorted({n for snap in snapshots for n in snap})
    color = {n: REQ_COLORS[i % len(REQ_COLORS)] for i, n in enumerate(names)}
    rows_n = -(-num_slots // cols)
    fig, axes = plt.subplots(1, len(steps), figsize=(2.6 * len(steps), 0.35 * rows_n + 1.0), squeeze=False)
    for ax, step in zip(axes[0], steps):
        owner = {slot: name for name, slots in snapshots[step].items() for slot in slots}
        for s in range(num_slots):
            r, c = divmod(s, cols)
            ax.add_patch(plt.Rectangle((c, rows_n - 1 - r), 0.92, 0.92, facecolor=color.get(owner.get(s), GREY)))
            if s in owner:
                ax.text(c + 0.46, rows_n - 1 - r + 0.46, owner[s], ha="center", va="center", fontsize=6.5, color="white")
        ax.set_xlim(0, cols), ax.set_ylim(0, rows_n), ax.set_aspect("equal"), ax.axis("off")
        ax.set_title(f"after step {step}", fontsize=9)
    fig.suptitle("KV pool slots by owner (grey = free)", fontsize=10)
    fig.tight_layout()
    return fig


def reserved_vs_used(used: Sequence[int], reserved: Sequence[int], capacity: int):
    """Slots a paged pool uses against what per-request contiguous reservations would hold."""
    fig, ax = plt.subplots(figsize=(7, 2.8))
    ax.plot(range(len(used)), reserved, marker="o", color=ORANGE, label="reserved up front (chapter 0 style)")
    ax.plot(range(len(used)), used, marker="o", color=BLUE, label="paged: slots actually written")
    ax.axhline(capacity, color="#555", linestyle="--", linewidth=1)
    ax.text(0, capacity + 0.8, f"pool capacity ({capacity} slots)", fontsize=8, color="#555")
    ax.set_xlabel("step"), ax.set_ylabel("slots"), ax.set_ylim(0, max(max(reserved), capacity) * 1.15)
    ax.legend(frameon=False, fontsize=8, loc="lower right"), ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def attention_masks(panels: Sequence[tuple]):
    """Boolean masks side by side: (title, mask [queries, keys], first query position or None)."""
    fig, axes = plt.subplots(1, len(panels), figsize=(3.6 * len(panels), 3.1))
    for ax, (title, mask, ylabels) in zip(axes, panels):
        m = mask.int().numpy()
        ax.imshow(m, cmap="Blues", vmin=0, vmax=1.4)
        ax.set_xticks(range(m.shape[1])), ax.set_yticks(range(m.shape[0]))
        ax.set_yticklabels(ylabels, fontsize=7.5), ax.set_xticklabels(range(m.shape[1]), fontsize=7.5)
        ax.set_xlabel("key position"), ax.set_title(title, fontsize=9)
        ax.set_xticks([x - 0.5 for x in range(1, m.shape[1])], minor=True)
        ax.set_yticks([y - 0.5 for y in range(1, m.shape[0])], minor=True)
        ax.grid(which="minor", color="white", linewidth=1), ax.tick_params(which="minor", length=0)
    fig.tight_layout()
    return fig
