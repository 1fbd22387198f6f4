"""Figures and small measurements for chapters 06-11.

Everything here draws or times the engine; nothing here is engine logic. Engine modules are
imported inside the functions, so a chapter's staged package only needs what that chapter uses.
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence

import matplotlib.pyplot as plt
from matplotlib.patches import Patch, Rectangle

PREFILL, CHUNK, DECODE = "#f28e2b", "#ffd8a8", "#4e79a7"
FREE, CACHED, LOCKED = "#e6e6e6", "#59a14f", "#e15759"
PALETTE = ["#4e79a7", "#f28e2b", "#76b7b2", "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac", "#af7aa1", "#86bcb6"]


# ---- text tables ------------------------------------------------------------------------------
def table(rows: Sequence[Dict[str, object]], columns: Optional[Sequence[str]] = None) -> str:
    """A fixed-width text table (stable, so a notebook can check it verbatim)."""
    columns = list(columns or rows[0].keys())
    cells = [[str(r.get(c, "")) for c in columns] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
    line = lambda vals: "  ".join(v.rjust(w) for v, w in zip(vals, widths))  # noqa: E731
    return "\n".join([line(columns), line(["-" * w for w in widths])] + [line(r) for r in cells])


def trace_lines(trace) -> str:
    """One line per launched batch, as the scheduler recorded it in `StepTrace`s."""
    out = []
    for t in trace:
        detail = ", ".join(f"uid{u}:{n}" for u, n in zip(t.uids, t.extend_lens))
        out.append(f"{t.phase:<7} bs={len(t.uids)}  tokens={sum(t.extend_lens):<4} [{detail}]")
    return "\n".join(out)


# ---- chapter 06: sampling ---------------------------------------------------------------------
def kept_distribution(logits, temperature: float, top_k: int, top_p: float):
    """The distribution a top-k / top-p sampler draws from, written plainly (for the picture)."""
    import torch

    probs = torch.softmax(logits.float() / max(temperature, 1e-6), dim=-1)
    sorted_p, order = probs.sort(descending=True)
    keep = torch.ones_like(sorted_p, dtype=torch.bool)
    if top_k > 0:
        keep[top_k:] = False
    # top-p measures mass on what top-k kept (the renormalised distribution), as the engine does
    keep &= (sorted_p.cumsum(0) - sorted_p) <= top_p * sorted_p[keep].sum()
    kept = torch.zeros_like(probs).scatter_(0, order, sorted_p * keep)
    return probs, kept / kept.sum()


def sampling_filters_figure(logits, decode: Callable[[int], str], temperature=0.8, top_k=5, top_p=0.8,
                            counts=None, n_show: int = 12):
    """Bars of the next-token distribution: raw, with temperature, after top-k, after top-p.
    `counts` (token id -> times drawn by the engine's sampler) adds measured frequencies."""
    import torch

    raw, _ = kept_distribution(logits, 1.0, -1, 1.0)
    panels = [
        ("softmax(logits)", raw),
        (f"temperature {temperature}", kept_distribution(logits, temperature, -1, 1.0)[1]),
        (f"+ top_k={top_k}", kept_distribution(logits, temperature, top_k, 1.0)[1]),
        (f"+ top_p={top_p}", kept_distribution(logits, temperature, top_k, top_p)[1]),
    ]
    ids = torch.argsort(raw, descending=True)[:n_show].tolist()
    labels = [repr(decode(i))[1:-1] or "?" for i in ids]
    fig, axes = plt.subplots(1, 4, figsize=(15, 3.3), sharey=True)
    for ax, (title, p) in zip(axes, panels):
        vals = [float(p[i]) for i in ids]
        ax.bar(range(n_show), vals, color=[DECODE if v > 0 else FREE for v in vals])
        ax.set_title(title, fontsize=10)
        ax.set_xticks(range(n_show), labels, rotation=70, fontsize=8)
    if counts is not None:
        total = sum(counts.values())
        axes[-1].plot(range(n_show), [counts.get(i, 0) / total for i in ids], "o", color=PREFILL,
                      label=f"engine sampler, {total} seeds")
        axes[-1].legend(fontsize=8)
    axes[0].set_ylabel("probability")
    fig.tight_layout()
    return fig


# ---- chapter 07 / 10 / 11: who ran in which step ----------------------------------------------
def schedule_timeline(trace, title: str = "", ax=None, label_uid: Callable[[int], str] = lambda u: f"uid{u}"):
    """A step-by-request grid: orange = prefill (pale: one of several chunks of a prompt), blue = decode.
    The number in a prefill cell is how many prompt tokens that step computed."""
    trace = list(trace)
    first = trace[0].step
    uids = sorted({u for t in trace for u in t.uids})
    row = {u: i for i, u in enumerate(uids)}
    if ax is None:
        _, ax = plt.subplots(figsize=(max(6, 0.45 * len(trace) + 2), 0.45 * len(uids) + 1.4))
    # a prompt computed over several prefill steps is drawn pale in every one of them
    prefills = defaultdict(int)
    for t in trace:
        for u in t.uids if t.phase == "prefill" else ():
            prefills[u] += 1
    for t in trace:
        for u, n, c in zip(t.uids, t.extend_lens, t.cached_lens):
            prefill = t.phase == "prefill"
            color = (CHUNK if prefills[u] > 1 else PREFILL) if prefill else DECODE
            x = t.step - first
            ax.add_patch(Rectangle((x, row[u] - 0.4), 0.92, 0.8, color=color))
            if prefill:
                ax.text(x + 0.46, row[u], str(n), ha="center", va="center", fontsize=7)
    ax.set_xlim(-0.2, trace[-1].step - first + 1.1)
    ax.set_ylim(len(uids) - 0.4, -0.6)
    ax.set_yticks(range(len(uids)), [label_uid(u) for u in uids])
    ax.set_xlabel("step (one launched batch each)")
    ax.legend(handles=[Patch(color=PREFILL, label="prefill"), Patch(color=CHUNK, label="prefill chunk"),
                       Patch(color=DECODE, label="decode")], loc="upper right", fontsize=8, ncol=3,
              bbox_to_anchor=(1, 1.25))
    ax.set_title(title, fontsize=10, loc="left")
    return ax


# ---- driving a scheduler step by step ---------------------------------------------------------
def drive(sched, arrivals: Dict[int, list], max_steps: int = 10_000) -> Dict[int, List[int]]:
    """Run `sched` step by step; before step k, add the requests in `arrivals[k]` (a list of
    (token ids, SamplingParams)). Returns uid -> generated tokens. Stops when idle and no
    arrival is left."""
    tokens: Dict[int, List[int]] = {}

    def on_token(req, token, reason):
        if token is not None:
            tokens.setdefault(req.uid, []).append(token)

    sched.on_token = on_token  # an instance attribute shadows the hook for this run only
    try:
        for step in range(max_steps):
            for ids, params in arrivals.get(step, []):
                tokens[sched.add_request(ids, params)] = []
            if sched.is_idle and step >= max(arrivals, default=0):
                break
            sched.step()
    finally:
        del sched.on_token
    return tokens


# ---- chapter 07: the ledger of one request -----------------------------------------------------
def record_ledger(sched, uid: int) -> List[Dict[str, object]]:
    """Wrap the scheduler's forward and result handling to snapshot request `uid`'s ledger at
    each point where it moves. Returns the (growing) list of rows."""
    rows: List[Dict[str, object]] = []

    def snap(when: str, req) -> None:
        rows.append(dict(when=when, cached_len=req.cached_len, device_len=req.device_len,
                         max_device_len=req.max_device_len, extend_len=req.extend_len,
                         remain_len=req.remain_len, host_tokens=len(req.input_ids)))

    forward, process = sched.engine.forward_batch, sched.process_results

    def forward_batch(batch, args):
        mine = [r for r in batch.reqs if r.uid == uid]
        for r in mine:
            snap(f"{batch.phase}: before forward", r)
        out = forward(batch, args)
        for r in mine:
            snap("  after complete_one", r)
        return out

    def process_results(result):
        process(result)
        for r in result.batch.reqs:
            if r.uid == uid:
                snap("  after append_host" + (f" ({r.finish_reason})" if r.finished else ""), r)

    sched.engine.forward_batch, sched.process_results = forward_batch, process_results
    return rows


# ---- chapter 08: page table and KV pool occupancy ----------------------------------------------
def occupancy_figure(sched, title: str = "", max_cols: Optional[int] = None):
    """Left: each live request's page-table row, one cell per position, coloured by the page it
    points to's owner. Right: every page of the KV pool: free, held by a request, or cached."""
    import numpy as np

    cache, ps = sched.cache, sched.cache.page_size
    owner = np.full(cache.num_pages, -1)  # -1 free, -2 prefix cache, else uid
    for p in cache.kept_pages():  # the prefix cache's pages (none without one)
        owner[int(p)] = -2
    live = sorted(sched.live.values(), key=lambda r: r.uid)
    for r in live:
        start, end = cache.own_start(r), cache.owned_pages(r, ps) * ps
        for p in sched.engine.page_table[r.table_idx, start:end].cpu().long()[::ps] // ps:
            owner[int(p)] = r.uid
    colour = lambda o: FREE if o == -1 else CACHED if o == -2 else PALETTE[o % len(PALETTE)]  # noqa: E731
    fig, (a, b) = plt.subplots(1, 2, figsize=(13, 0.5 * max(len(live), 3) + 1.6), gridspec_kw=dict(width_ratios=[3, 2]))
    cols = max_cols or max([cache.owned_pages(r, ps) * ps for r in live] + [ps])
    for i, r in enumerate(live):
        slots = sched.engine.page_table[r.table_idx, : cache.owned_pages(r, ps) * ps].cpu().long()
        for pos in range(0, min(len(slots), cols), ps):
            page = int(slots[pos]) // ps
            a.add_patch(Rectangle((pos + 0.05, i - 0.4), ps - 0.1, 0.8, color=colour(owner[page])))
            if cols <= 96:
                a.text(pos + ps / 2, i, str(page), ha="center", va="center", fontsize=7)
        a.plot([r.cached_len, r.cached_len], [i - 0.45, i + 0.45], color="black", lw=1.5)
    a.set_xlim(0, cols)
    a.set_ylim(max(len(live), 1) - 0.4, -0.6)
    a.set_yticks(range(len(live)), [f"uid{r.uid} (row {r.table_idx})" for r in live])
    a.set_xlabel("position (one box per page, labelled with its page id; black bar: cached_len)")
    a.set_title("page table rows of live requests", fontsize=10, loc="left")
    width = int(np.ceil(np.sqrt(cache.num_pages * 2)))
    for p in range(cache.num_pages):
        b.add_patch(Rectangle((p % width, p // width), 0.92, 0.92, color=colour(owner[p])))
        if cache.num_pages <= 64:
            b.text(p % width + 0.46, p // width + 0.46, str(p), ha="center", va="center", fontsize=7)
    b.set_xlim(0, width)
    b.set_ylim(cache.num_pages // width + 1, 0)
    b.set_xticks([])
    b.set_yticks([])
    counts = {"free": int((owner == -1).sum()), "prefix cache": int((owner == -2).sum())}
    b.set_title(f"KV pool: {cache.num_pages} pages of {ps} slots  " + ", ".join(f"{k} {v}" for k, v in counts.items()),
                fontsize=9, loc="left")
    handles = [Patch(color=FREE, label="free"), Patch(color=CACHED, label="prefix cache")]
    handles += [Patch(color=colour(r.uid), label=f"uid{r.uid}") for r in live]
    b.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.suptitle(title, fontsize=11, x=0.01, ha="left")
    fig.tight_layout()
    return fig


def pool_counts(sched) -> Dict[str, int]:
    """Where the KV pool's pages are now: held by live requests, promised to them, cached, free."""
    cache = sched.cache
    live = [r for r in sched.live.values() if not r.finished]
    held = sum(cache.owned_pages(r, cache.page_size) - r.cache_handle.cached_len // cache.page_size for r in sched.live.values())
    promised = sum(cache.pages_to_finish(r) for r in live)
    return dict(held=held, promised=promised, cached=len(cache.kept_pages()),
                free=cache.free_pages, running=len(live), waiting=len(sched.prefill.pending))


def pool_history_figure(history: Sequence[Dict[str, int]], num_pages: int, title: str = ""):
    """Stacked pages per step: held by requests, promised (reserved, not yet allocated), cached,
    and free beyond the promises. Admission keeps held + promised <= free + held (+ evictable)."""
    import numpy as np

    x = np.arange(len(history))
    held = np.array([h["held"] for h in history])
    promised = np.array([h["promised"] for h in history])
    cached = np.array([h["cached"] for h in history])
    spare = np.maximum(num_pages - held - cached - promised, 0)
    fig, ax = plt.subplots(figsize=(10, 3))
    ax.stackplot(x, held, promised, cached, spare, labels=["held by requests", "promised to them (reserved)", "prefix cache", "spare"],
                 colors=[DECODE, "#a0cbe8", CACHED, FREE], step="post")
    ax2 = ax.twinx()
    ax2.step(x, [h["waiting"] for h in history], where="post", color=LOCKED, lw=1.5, label="waiting requests")
    ax2.set_ylabel("waiting", color=LOCKED)
    ax2.set_ylim(0, max(max(h["waiting"] for h in history) + 1, 2))
    ax.set_xlim(0, len(history) - 1)
    ax.set_ylim(0, num_pages)
    ax.set_xlabel("step")
    ax.set_ylabel("pages")
    ax.legend(loc="upper left", bbox_to_anchor=(1.08, 1), fontsize=8)
    ax.set_title(title, fontsize=10, loc="left")
    fig.tight_layout()
    return fig


# ---- chapter 09: radix tree ---------------------------------------------------------------------
def _layout(root) -> Dict[int, tuple]:
    """x by leaf order, y by depth; returns id(node) -> (x, y, node)."""
    pos: Dict[int, tuple] = {}
    nxt = [0]

    def visit(node, depth: int) -> float:
        kids = sorted(node.children.values(), key=lambda c: c.key.tolist())
        if not kids:
            x = nxt[0]
            nxt[0] += 1
        else:
            xs = [visit(k, depth + 1) for k in kids]
            x = sum(xs) / len(xs)
        pos[id(node)] = (x, depth, node)
        return x

    visit(root, 0)
    return pos


def draw_radix_tree(cache, decode: Callable[[List[int]], str], ax=None, title: str = "",
                    mark: Optional[Dict[int, str]] = None, width: int = 24):
    """Draw a `RadixPrefixCache`: one box per edge (its tokens as text), `ref` = lock count,
    `t` = last access tick. Green: evictable; red: locked. `mark` maps id(node) -> a note."""
    pos = _layout(cache.root)
    if ax is None:
        n_leaves = max(1, sum(1 for _, _, n in pos.values() if not n.children))
        depth = max(d for _, d, _ in pos.values())
        _, ax = plt.subplots(figsize=(max(4, 2.6 * n_leaves), 1.25 * (depth + 1) + 0.3))
    for x, y, node in pos.values():
        if node.parent is not None:
            px, py, _ = pos[id(node.parent)]
            ax.plot([px, x], [py, y], color="#999999", lw=1, zorder=1)
    for x, y, node in pos.values():
        if node.parent is None:
            ax.text(x, y, "root", ha="center", va="center", fontsize=8,
                    bbox=dict(boxstyle="round", fc="white", ec="#999999"))
            continue
        text = repr(decode(node.key.tolist()))[1:-1]
        text = text if len(text) <= width else text[: width - 1] + "…"
        note = (mark or {}).get(id(node), "")
        label = f"'{text}'\n{len(node)} tok, ref={node.ref_count}, t={node.last_access}" + (f"\n{note}" if note else "")
        ax.text(x, y, label, ha="center", va="center", fontsize=7.5, zorder=2,
                bbox=dict(boxstyle="round", fc="#f6c4c5" if node.ref_count else "#cfe8c9",
                          ec="black" if note else "none"))
    xs = [x for x, _, _ in pos.values()]
    ax.set_xlim(min(xs) - 0.7, max(xs) + 0.7)
    ax.set_ylim(max(y for _, y, _ in pos.values()) + 0.6, -0.5)
    ax.axis("off")
    ax.set_title(title, fontsize=10, loc="left")
    return ax


class TreeFilm:
    """Snapshots of a radix cache after each operation, drawn side by side at the end.
    `mark` maps nodes of the live cache to a note; snapshots are deep copies."""

    def __init__(self, decode: Callable[[List[int]], str]):
        self.decode = decode
        self.frames: List[tuple] = []

    def snap(self, cache, title: str, mark: Optional[Dict[object, str]] = None) -> None:
        import copy

        memo: Dict[int, object] = {}
        frozen = copy.deepcopy(cache, memo)
        notes = {id(memo[id(n)]): note for n, note in (mark or {}).items() if id(n) in memo}
        self.frames.append((title, frozen, notes))

    def show(self, cols: int = 3):
        rows = -(-len(self.frames) // cols)
        fig, axes = plt.subplots(rows, cols, figsize=(5.4 * cols, 3.3 * rows), squeeze=False)
        for ax in axes.flat[len(self.frames):]:
            ax.axis("off")
        for ax, (title, snapshot, notes) in zip(axes.flat, self.frames):
            draw_radix_tree(snapshot, self.decode, ax=ax, title=title, mark=notes)
        fig.tight_layout()
        return fig


def radix_explorer(tokenizer, initial: Sequence[str] = ()):
    """Type a prompt, press a button, and watch a radix cache (page size 1, fake slots) change."""
    import ipywidgets as w
    import torch
    from IPython.display import display
    from minisgl.kvcache import RadixPrefixCache

    cache = RadixPrefixCache(page_size=1, device=torch.device("cpu"))
    state = {"next_slot": 0, "locks": []}
    text = w.Text(value="", placeholder="type a prompt", layout=w.Layout(width="420px"))
    buttons = {name: w.Button(description=name, layout=w.Layout(width="90px")) for name in ("insert", "match", "lock", "unlock all", "evict 4")}
    log, out = w.HTML(), w.Output()
    decode = lambda ids: tokenizer.decode(ids)  # noqa: E731

    def ids() -> torch.Tensor:
        return torch.tensor(tokenizer.encode(text.value), dtype=torch.int32)

    def redraw(msg: str) -> None:
        log.value = f"<code>{msg}</code>"
        out.clear_output(wait=True)
        with out:
            fig, ax = plt.subplots(figsize=(9, 3.2))
            draw_radix_tree(cache, decode, ax=ax, title=f"cached {cache.size} tokens, evictable {cache.evictable_size}")
            display(fig)
            plt.close(fig)

    def insert(_=None) -> None:
        t = ids()
        slots = torch.arange(state["next_slot"], state["next_slot"] + len(t), dtype=torch.int32)
        state["next_slot"] += len(t)
        had = cache.insert_prefix(t, slots)
        redraw(f"insert {len(t)} tokens: {had} were already cached, {len(t) - had} new")

    def match(_=None) -> None:
        m = cache.match_prefix(ids())
        redraw(f"match: {m.handle.cached_len} of {len(ids())} tokens hit, slots {m.indices.tolist()[:12]}")

    def lock(_=None) -> None:
        m = cache.match_prefix(ids())
        cache.lock_handle(m.handle)
        state["locks"].append(m.handle)
        redraw(f"locked a {m.handle.cached_len}-token prefix (it cannot be evicted now)")

    def unlock(_=None) -> None:
        for h in state["locks"]:
            cache.lock_handle(h, unlock=True)
        n, state["locks"] = len(state["locks"]), []
        redraw(f"released {n} locks")

    def evict(_=None) -> None:
        freed = cache.evict(4)
        redraw(f"evicted {len(freed)} slots (least recently used unlocked leaves first)")

    for name, fn in zip(buttons, (insert, match, lock, unlock, evict)):
        buttons[name].on_click(fn)
    for p in initial:
        text.value = p
        insert()
    text.value = ""
    redraw(f"{len(initial)} prompts inserted; type one and press a button")
    return w.VBox([w.HBox([text, *buttons.values()]), log, out])


# ---- chapter 10: latency under a mixed workload -------------------------------------------------
@dataclass
class TokenLog:
    """When each request received each token (perf_counter seconds)."""

    added: Dict[int, float] = field(default_factory=dict)
    times: Dict[int, List[float]] = field(default_factory=lambda: defaultdict(list))

    def ttft(self, uid: int) -> float:
        return self.times[uid][0] - self.added[uid]

    def gaps(self, uid: int) -> List[float]:
        t = self.times[uid]
        return [b - a for a, b in zip(t, t[1:])]


def run_mixed(sched, short_prompts, long_prompt, short_tokens: int, long_tokens: int, arrive_after: int) -> TokenLog:
    """Short requests decode; after `arrive_after` steps a long prompt arrives. Logs token times."""
    from minisgl.core import SamplingParams

    log = TokenLog()
    sched.on_token = lambda req, tok, reason: tok is not None and log.times[req.uid].append(time.perf_counter())
    for p in short_prompts:
        log.added[sched.add_request(p, SamplingParams(max_tokens=short_tokens, ignore_eos=True))] = time.perf_counter()
    for _ in range(arrive_after):
        sched.step()
    log.added[sched.add_request(long_prompt, SamplingParams(max_tokens=long_tokens, ignore_eos=True))] = time.perf_counter()
    while not sched.is_idle:
        sched.step()
    del sched.on_token
    return log


def prefill_first(sched):
    """A policy variant for experiments: prefill whenever there is a prompt to compute, even
    between two chunks of a long prompt (the engine gives the running requests a decode step
    there instead). Installed on this one scheduler instance; returns an undo."""
    plain = sched.schedule_next_batch

    def schedule_next_batch():
        sched._decode_turn = False  # forget the engine's "decode next" after a chunk
        return plain()

    sched.schedule_next_batch = schedule_next_batch
    return lambda: delattr(sched, "schedule_next_batch")


def latency_figure(results: Dict[str, Dict[int, TokenLog]], long_uid: Dict[str, Dict[int, int]], short_uids: Dict[str, Dict[int, List[int]]]):
    """TTFT of the long prompt and the worst gap between two tokens of a running request,
    against the prefill budget, one line per policy."""
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 3.2))
    for (policy, runs), colour in zip(results.items(), (PREFILL, DECODE)):
        chunks = sorted(runs)
        ttft = [runs[c].ttft(long_uid[policy][c]) * 1e3 for c in chunks]
        worst = [max(g for u in short_uids[policy][c] for g in runs[c].gaps(u)) * 1e3 for c in chunks]
        a.plot(chunks, ttft, "o-", color=colour, label=policy)
        b.plot(chunks, worst, "o-", color=colour, label=policy)
    for ax, title in ((a, "TTFT of the long prompt"), (b, "worst gap between two tokens of a running request")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(chunks, [str(c) for c in chunks])
        ax.minorticks_off()
        ax.set_xlabel("prefill budget per step (max_extend_tokens)")
        ax.set_ylabel("ms")
        ax.set_title(title, fontsize=10, loc="left")
        ax.set_ylim(bottom=0)
    a.legend(fontsize=8)
    fig.tight_layout()
    return fig


# ---- chapter 11: CPU work against device work ---------------------------------------------------
def time_phases(sched) -> List[tuple]:
    """Wrap the scheduler so every phase of a step records (name, start, end)."""
    events: List[tuple] = []

    def timed(name, fn):
        def run(*a, **k):
            t0 = time.perf_counter()
            out = fn(*a, **k)
            events.append((name, t0, time.perf_counter()))
            return out

        return run

    sched.schedule_next_batch = timed("schedule", sched.schedule_next_batch)
    sched.prepare = timed("prepare", sched.prepare)
    sched.engine.forward_batch = timed("forward", sched.engine.forward_batch)
    sched.process_results = timed("process", sched.process_results)
    return events


def overlap_log(sched) -> List[str]:
    """Wrap launch, result handling, finishing and freeing to write down, in order, what the
    loop does: which step is launched, which step's results are read, what is thrown away."""
    lines: List[str] = []
    step_of: Dict[int, int] = {}
    launch, process, finish, free = sched.launch, sched.process_results, sched._finish, sched._free

    def launch_(batch):
        result = launch(batch)
        step_of[id(result)] = sched._step - 1
        lines.append(f"launch  step {sched._step - 1}: {batch.phase} {[r.uid for r in batch.reqs]}")
        return result

    def process_(result):
        n = step_of[id(result)]
        late = [r.uid for r in result.batch.reqs if r.finished]
        lines.append(f"read    step {n}" + (f"  (discard the token of finished {late})" if late else ""))
        process(result)

    def finish_(req, reason, notify=True):
        in_flight = [step_of[id(r)] for r in sched.unprocessed if req.uid in r.uids]
        lines.append(f"  finish uid{req.uid} ({reason}, {len(req.output_ids)} tokens)"
                     + (f": row {req.table_idx} kept, step {in_flight} still uses it" if in_flight else ""))
        finish(req, reason, notify)

    def free_(req):
        free(req)
        if req.uid not in sched.live:  # freed now, not held back for a launched step
            lines.append(f"  free   uid{req.uid}: row {req.table_idx} and its pages")

    sched.launch, sched.process_results, sched._finish, sched._free = launch_, process_, finish_, free_
    return lines


def phase_means(events: List[tuple]) -> Dict[str, float]:
    """Mean milliseconds per call of each measured phase."""
    sums: Dict[str, List[float]] = defaultdict(list)
    for name, t0, t1 in events:
        sums[name].append((t1 - t0) * 1e3)
    return {k: sum(v) / len(v) for k, v in sums.items()}


def emulate_lanes(events: List[tuple], device_speedup: float = 1.0):
    """Lay measured phase durations out as the normal loop runs them and as the overlap loop
    would on a GPU. Returns (normal lanes, overlap lanes, normal total s, overlap total s, steps)."""
    per_step: List[Dict[str, float]] = []
    cur: Dict[str, float] = defaultdict(float)
    for name, t0, t1 in events:
        if name == "schedule" and "forward" in cur:
            per_step.append(dict(cur))
            cur = defaultdict(float)
        cur[name] += t1 - t0
    per_step.append(dict(cur))
    per_step = [s for s in per_step if "forward" in s]
    # CPU phases: the median over steps, so one step preempted on a shared machine does not
    # dominate the picture; device phases as measured, scaled by `device_speedup`
    median = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
    plan = median([s.get("schedule", 0) + s.get("prepare", 0) for s in per_step])
    read = median([s.get("process", 0) for s in per_step])
    cpu_before = [plan] * len(per_step)
    fwd = [s["forward"] / device_speedup for s in per_step]
    proc = [read] * len(per_step)

    normal = {"cpu": [], "gpu": []}
    t = 0.0
    for a, f, p in zip(cpu_before, fwd, proc):
        normal["cpu"].append((t, a, "plan"))
        normal["gpu"].append((t + a, f, "forward"))
        normal["cpu"].append((t + a + f, p, "read"))
        t += a + f + p
    normal_total = t

    overlap = {"cpu": [], "gpu": []}
    cpu_t, gpu_free = 0.0, 0.0
    for i, (a, f) in enumerate(zip(cpu_before, fwd)):
        overlap["cpu"].append((cpu_t, a, "plan"))
        start = max(cpu_t + a, gpu_free)  # the launch is queued; the device runs it when free
        overlap["gpu"].append((start, f, "forward"))
        gpu_free = start + f
        cpu_t += a
        if i > 0:  # read step i-1 while step i computes: wait for i-1 to be done first
            begin = max(cpu_t, overlap["gpu"][i - 1][0] + overlap["gpu"][i - 1][1])
            overlap["cpu"].append((begin, proc[i - 1], "read"))
            cpu_t = begin + proc[i - 1]
    begin = max(cpu_t, gpu_free)
    overlap["cpu"].append((begin, proc[-1], "read"))
    overlap_total = begin + proc[-1]

    return normal, overlap, normal_total, overlap_total, len(fwd)


def emulated_timelines(events: List[tuple], device_speedup: float = 1.0):
    """Draw the two layouts of `emulate_lanes`. Returns the figure and the two total times."""
    normal, overlap, normal_total, overlap_total, steps = emulate_lanes(events, device_speedup)
    colours = {"plan": "#76b7b2", "forward": DECODE, "read": PREFILL}
    fig, axes = plt.subplots(2, 1, figsize=(13, 3.4), sharex=True)
    for ax, (name, lanes, total) in zip(axes, [("normal loop", normal, normal_total), ("overlap loop", overlap, overlap_total)]):
        for y, lane in enumerate(("cpu", "gpu")):
            for i, (s, d, kind) in enumerate(lanes[lane]):
                ax.add_patch(Rectangle((s * 1e3, y - 0.35), d * 1e3, 0.7, color=colours[kind], ec="white", lw=0.5))
        ax.set_yticks([0, 1], ["CPU", "device"])
        ax.set_ylim(1.6, -0.6)
        ax.set_title(f"{name}: {total * 1e3:.0f} ms for {steps} steps", fontsize=10, loc="left")
    axes[-1].set_xlabel("ms (phase durations measured on the CPU, laid out as a GPU would run them)")
    axes[-1].set_xlim(0, max(normal_total, overlap_total) * 1e3 * 1.01)
    axes[0].legend(handles=[Patch(color=c, label=k) for k, c in colours.items()], fontsize=8, ncol=3,
                   loc="upper right", bbox_to_anchor=(1, 1.45))
    fig.tight_layout()
    return fig, normal_total, overlap_total


def overlap_results(path) -> List[Dict[str, object]]:
    """The rows `python -m minisgl.benchmark.overlap --json PATH` wrote."""
    import json
    from pathlib import Path

    return json.loads(Path(path).read_text())


def overlap_table(results: Sequence[Dict[str, object]]) -> str:
    """One line per batch size: each phase of a step with overlap off, and the two step times."""
    rows = []
    for r in results:
        off, on = r["off"], r["on"]
        ph = off["phases_ms"]
        busy = ph["schedule"] + ph["prepare"] + ph["read"]
        rows.append({"batch": r["batch_size"], **{p: f"{ph[p]:.2f}" for p in ("schedule", "prepare", "launch", "wait", "read")},
                     "step, off": f"{off['step_ms']:.2f}", "sched+prep+read": f"{100 * busy / off['step_ms']:.0f}%",
                     "step, on": f"{on['step_ms']:.2f}", "saved": f"{100 * (1 - on['step_ms'] / off['step_ms']):.0f}%"})
    return table(rows)


def overlap_measured_figure(results: Sequence[Dict[str, object]], title: str = ""):
    """Per batch size, a decode step with overlap off (its phases, as measured on the host)
    above the same step with overlap on (its measured length)."""
    colours = {"schedule": "#59a14f", "prepare": "#76b7b2", "launch": "#edc948", "wait": DECODE, "read": PREFILL}
    fig, ax = plt.subplots(figsize=(9, 0.9 + 0.75 * len(results)))
    labels = []
    for i, r in enumerate(results):
        y = 2 * i
        x = 0.0
        for phase, c in colours.items():
            d = r["off"]["phases_ms"][phase]
            ax.barh(y, d, left=x, color=c, edgecolor="white", height=0.8)
            x += d
        ax.barh(y + 0.9, r["on"]["step_ms"], color="#bab0ac", height=0.8)
        labels += [(y, f"batch {r['batch_size']}, overlap off"), (y + 0.9, "overlap on")]
    ax.set_yticks([y for y, _ in labels], [t for _, t in labels], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("ms per decode step (medians over the steps of one run)")
    handles = [Patch(color=c, label=k) for k, c in colours.items()] + [Patch(color="#bab0ac", label="whole step, overlap on")]
    ax.legend(handles=handles, fontsize=7, ncol=3, loc="lower right")
    ax.set_title(title, fontsize=10, loc="left")
    fig.tight_layout()
    return fig
