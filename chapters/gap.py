"""Workloads, a page-accounting simulator and figures for chapter 22 (the gap to SGLang).

Nothing here is engine logic. `simulate` replays admission and decoding at the level of KV pages
only (page size 1, no prefix cache, one kind of step at a time, prefill first), so that a policy
the engine does not have, optimistic admission with retraction, can be compared with the one it
has on the same requests. With `ratio=1.0` it is the engine's rule, and the chapter checks that it
reproduces a real engine run step for step before trusting it with `ratio < 1`.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

# ---- workloads ------------------------------------------------------------------------------


def shared_prefix_prompts(groups: int, per_group: int, prefix_len: int, tail: int, seed: int = 0) -> List[List[int]]:
    """`groups` system prompts, each followed by `per_group` different questions, arriving in turn
    (group 0, 1, ..., groups - 1, 0, 1, ...): the order in which unrelated users would send them."""
    rng = random.Random(seed)
    prefixes = [[rng.randrange(10, 5000) for _ in range(prefix_len)] for _ in range(groups)]
    return [prefixes[i % groups] + [rng.randrange(10, 5000) for _ in range(tail)] for i in range(groups * per_group)]


@dataclass(frozen=True)
class SimReq:
    uid: int
    prompt: int  # prompt tokens
    max_tokens: int  # what the client declared
    output: int  # what the model produces before its end-of-sequence token (<= max_tokens)


def chat_requests(n: int, prompt: Sequence[int], output: Sequence[int], max_tokens: int, seed: int = 0) -> List[SimReq]:
    """Requests whose answers are shorter than the cap they declare, as chat traffic is."""
    rng = random.Random(seed)
    return [SimReq(i, rng.randint(*prompt), max_tokens, rng.randint(*output)) for i in range(n)]


# ---- the simulator --------------------------------------------------------------------------


@dataclass
class SimStep:
    phase: str  # "prefill" | "decode"
    uids: List[int]
    retracted: List[int] = field(default_factory=list)  # sent back to the queue before this step


@dataclass
class SimResult:
    steps: List[SimStep]
    recomputed_tokens: int  # prompt and output tokens prefilled again after a retraction
    output_tokens: int

    @property
    def decode_sizes(self) -> List[int]:
        return [len(s.uids) for s in self.steps if s.phase == "decode"]

    @property
    def retractions(self) -> int:
        return sum(len(s.retracted) for s in self.steps)

    def decode_seconds(self, tpot_ms: Dict[int, float]) -> float:
        """Decode time if each step took the measured time per token at its batch size
        (linear between the measured sizes); prefill is left out."""
        sizes = sorted(tpot_ms)
        total = 0.0
        for b in self.decode_sizes:
            lo = max([s for s in sizes if s <= b], default=sizes[0])
            hi = min([s for s in sizes if s >= b], default=sizes[-1])
            t = tpot_ms[lo] if hi == lo else tpot_ms[lo] + (tpot_ms[hi] - tpot_ms[lo]) * (b - lo) / (hi - lo)
            total += t / 1e3
        return total


@dataclass
class _Live:
    req: SimReq
    prompt: int  # tokens prefilled at admission (the prompt, plus earlier output after a retraction)
    kept: int  # output tokens produced before that admission (inside `prompt`)
    done: int  # output tokens produced so far
    order: int  # admission order: the newest is retracted first

    @property
    def pages(self) -> int:  # every token but the newest has its KV written
        return self.prompt + (self.done - self.kept) - 1


def simulate(reqs: Sequence[SimReq], num_pages: int, max_running: int, ratio: float = 1.0, max_steps: int = 100_000) -> SimResult:
    """Admit first come, first served while the pool covers every running request's estimated
    future pages plus the newcomer's; `ratio` scales the estimate of the tokens a request has yet
    to produce (1.0: all of `max_tokens`, the engine's reservation). When a decode step finds too
    few free pages, the newest running requests are retracted: their pages are freed and they
    wait at the head of the queue to be prefilled again, output so far included."""
    assert 0 < ratio <= 1.0
    waiting: List[tuple] = [(r, 0) for r in reqs]  # (request, output tokens it already has)
    live: Dict[int, _Live] = {}
    free, steps, recomputed, admitted = num_pages, [], 0, 0

    def future(l: _Live) -> int:  # pages a running request is still expected to take
        return math.ceil(ratio * (l.req.max_tokens - l.done))

    def finish_if_done(l: _Live) -> None:
        nonlocal free
        if l.done >= l.req.output:
            free += l.pages
            del live[l.req.uid]

    for _ in range(max_steps):
        if not waiting and not live:
            break
        promised = sum(future(l) for l in live.values())
        batch: List[_Live] = []
        while waiting and len(live) < max_running:
            r, kept = waiting[0]
            prompt = r.prompt + kept  # a retracted request recomputes its output so far too
            later = math.ceil(ratio * (r.max_tokens - kept - 1))  # after the token this prefill samples
            if free < promised + prompt + later:
                break
            waiting.pop(0)
            l = live[r.uid] = _Live(r, prompt, kept, kept, admitted)
            admitted += 1
            free -= prompt
            promised += later
            recomputed += prompt if kept else 0
            batch.append(l)
        if batch:
            steps.append(SimStep("prefill", [l.req.uid for l in batch]))
            for l in batch:
                l.done += 1  # the first token comes with the prefill
                finish_if_done(l)
            continue
        retracted = []
        while len(live) > free:  # every running request needs one more page this step
            newest = max(live.values(), key=lambda l: l.order)
            del live[newest.req.uid]
            free += newest.pages
            waiting.insert(0, (newest.req, newest.done))
            retracted.append(newest.req.uid)
        if not live:
            raise RuntimeError("a single request needs more pages than the pool has")
        running = sorted(live.values(), key=lambda l: l.req.uid)
        steps.append(SimStep("decode", [l.req.uid for l in running], retracted))
        free -= len(running)
        for l in running:
            l.done += 1
            finish_if_done(l)
    return SimResult(steps, recomputed, sum(r.output for r in reqs))


def measured_tpot_ms(path: str = "minisgl/benchmark/RESULTS.md") -> Dict[int, float]:
    """Batch size -> time per output token with CUDA graphs, from the committed GPU results
    (the "Time per output token" table); empty when nothing was measured."""
    from pathlib import Path

    file = Path(__file__).resolve().parents[1] / path
    text = file.read_text() if file.is_file() else ""
    table: Dict[int, float] = {}
    for section in text.split("\n## ")[1:]:
        if section.startswith("Time per output token"):
            for line in section.splitlines():
                cells = [c.strip() for c in line.strip().strip("|").split("|")]
                if len(cells) >= 2 and cells[0].isdigit() and cells[1].endswith("ms"):
                    table[int(cells[0])] = float(cells[1].split()[0])
    return table


def engine_steps(trace) -> List[SimStep]:
    """The engine's step trace in the simulator's terms (decode batches in uid order)."""
    return [SimStep(t.phase, sorted(t.uids) if t.phase == "decode" else list(t.uids)) for t in trace]


def stop_after(llm_class, outputs: Dict[int, int]):
    """An LLM whose model 'says end-of-sequence' after `outputs[uid]` tokens: the stand-in for
    answers shorter than their `max_tokens` on a model with random weights."""

    class StopsEarly(llm_class):
        def _finish_reason(self, req, token):
            if len(req.input_ids) - req.prompt_len >= outputs.get(req.uid, 1 << 30):
                return "stop"
            return super()._finish_reason(req, token)

    return StopsEarly


# ---- figures --------------------------------------------------------------------------------

GROUP_COLORS = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#b07aa1", "#76b7b2", "#edc948", "#9c755f"]
YES, PARTLY, NO = "#59a14f", "#edc948", "#e15759"


def feature_matrix(rows: Sequence[tuple], engines: Sequence[str] = ("minisgl", "SGLang", "vLLM")):
    """rows: (feature, mark per engine) with marks 'yes', 'partly' or 'no'."""
    import matplotlib.pyplot as plt

    colors = {"yes": YES, "partly": PARTLY, "no": NO}
    fig, ax = plt.subplots(figsize=(7.2, 0.32 * len(rows) + 0.8))
    for y, (name, *marks) in enumerate(rows):
        for x, m in enumerate(marks):
            ax.add_patch(plt.Rectangle((x, y), 0.94, 0.9, color=colors[m]))
            ax.text(x + 0.47, y + 0.45, m, ha="center", va="center", fontsize=7, color="white" if m != "partly" else "black")
    ax.set_xlim(0, len(engines)); ax.set_ylim(len(rows), 0)
    ax.set_xticks([i + 0.47 for i in range(len(engines))], engines); ax.xaxis.tick_top()
    ax.set_yticks([i + 0.45 for i in range(len(rows))], [r[0] for r in rows], fontsize=8)
    ax.tick_params(length=0)
    for s in ax.spines.values():
        s.set_visible(False)
    fig.tight_layout()
    return fig


def prefill_groups_figure(runs: Dict[str, tuple], groups: int, prefix_len: int):
    """One row per run: each admitted request as a square at its prefill step, coloured by its
    prefix group, solid for a prefix hit and pale for a miss. runs: name -> (trace, prompts)."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(runs), 1, figsize=(9, 1.5 * len(runs)), sharex=True, squeeze=False)
    for ax, (name, (trace, group_of)) in zip(axes[:, 0], runs.items()):
        x = 0
        for t in trace:
            if t.phase != "prefill":
                continue
            for i, (uid, cached) in enumerate(zip(t.uids, t.cached_lens)):
                hit = cached >= prefix_len
                ax.add_patch(plt.Rectangle((t.step, i), 0.9, 0.9, color=GROUP_COLORS[group_of[uid] % len(GROUP_COLORS)], alpha=1.0 if hit else 0.3))
            x = max(x, t.step + 1)
        ax.set_ylim(4.2, -0.2); ax.set_xlim(0, x); ax.set_yticks([]); ax.set_ylabel(name, rotation=0, ha="right", va="center")
    axes[-1, 0].set_xlabel("engine step (prefill steps only; solid: prefix hit, pale: computed again; colour: prefix group)")
    fig.tight_layout()
    return fig


def batch_size_figure(results: Dict[str, SimResult]):
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 2.8))
    for (name, res), color in zip(results.items(), GROUP_COLORS):
        sizes = res.decode_sizes
        ax.plot(range(len(sizes)), sizes, color=color, label=f"{name}: {len(sizes)} decode steps, {res.retractions} retractions")
        marks = [i for i, s in enumerate(st for st in res.steps if st.phase == "decode") if s.retracted]
        ax.plot(marks, [sizes[i] for i in marks], "x", color=color, markersize=5)
    ax.set_xlabel("decode step"); ax.set_ylabel("running requests"); ax.legend(fontsize=7, loc="upper right")
    fig.tight_layout()
    return fig
