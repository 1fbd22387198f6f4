"""Workloads, a page-accounting simulator and figures for chapter 22 (the gap to SGLang).

Nothing here is engine logic. `simulate` replays admission and decoding at the level of KV pages
only (page size 1, no prefix cache, one kind of step at a time, prefill first), so that a policy
the engine does not have, optimistic admission with retraction, can be compared with the one it
has on the same requests. With `ratio=1.0` it is the engine's rule, pass-over included (the walk's
bound is the engine's `MAX_PASSED_OVER`, imported), and the chapter checks that it reproduces a
real engine run step for step before trusting it with `ratio < 1`.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

# ---- the map: each mark of minisgl's checked against the engine -----------------------------

REPO = Path(__file__).resolve().parents[1]
MARKS = ("yes", "partly", "no")


@dataclass(frozen=True)
class Feature:
    """One row of the map. minisgl's mark is backed by evidence: every probe in `has` must find its
    piece in the engine, and no entry of `lacks` may be found: a probe there must find nothing, a
    plain word must appear in none of the package's source files.
    A probe is "sym:module:Name.attr" (importable), "field:module:Class.name" (a dataclass or
    pydantic field), "flag:--name" (an option of `python -m minisgl`), "route:/path" (a route of
    the API server) or "src:module:Name.attr:text" (that object's source contains `text`)."""

    name: str
    minisgl: str
    sglang: str
    vllm: str
    has: Tuple[str, ...] = ()
    # probes that must find nothing, or identifiers no source file contains (specific names such as
    # `compile_regex` or `"mixed"`, not ordinary words a comment could use for something else)
    lacks: Tuple[str, ...] = ()

    def __post_init__(self) -> None:
        assert {self.minisgl, self.sglang, self.vllm} <= set(MARKS), self
        assert (self.minisgl == "no") == (not self.has), f"{self.name}: a 'no' has no evidence, anything else needs some"
        assert (self.minisgl == "yes") == (not self.lacks), f"{self.name}: 'partly' and 'no' name what is missing"


FEATURES = (
    Feature("paged KV, continuous batching", "yes", "yes", "yes",
            has=("sym:minisgl.scheduler.pages:PageAllocator.pages_to_finish", "sym:minisgl.scheduler.decode:DecodeManager", "flag:--page-size")),
    # minisgl and SGLang keep a radix tree of tokens; vLLM hashes whole blocks: all three reuse a cached prompt's KV
    Feature("prefix cache (tree or block hashes)", "yes", "yes", "yes", has=("sym:minisgl.kvcache.radix_cache:RadixPrefixCache", "flag:--prefix-cache")),
    Feature("chunked prefill", "yes", "yes", "yes", has=("sym:minisgl.scheduler.chunked:ChunkedPrefillAdder.continue_chunk", "flag:--max-extend-tokens")),
    Feature("overlap of host and device", "yes", "yes", "yes", has=("field:minisgl.scheduler:SchedulerConfig.overlap", "flag:--disable-overlap")),
    Feature("CUDA graphs, tensor parallelism", "yes", "yes", "yes",
            has=("sym:minisgl.engine.graph:GraphRunner", "flag:--cuda-graph", "sym:minisgl.distributed.split:check_tp_split", "flag:--tp-size")),
    Feature("mixed prefill + decode batches", "no", "yes", "yes", lacks=("mixed_chunk", "mixed_batch", '"mixed"')),
    Feature("optimistic admission, retraction", "no", "yes", "yes", lacks=("retract", "preempt", "new_token_ratio")),
    Feature("cache-aware scheduling", "yes", "yes", "partly",
            has=("sym:minisgl.scheduler.prefix:longest_prefix_first", "flag:--schedule-policy",
                 "sym:minisgl.scheduler.aging:AgedLongestPrefix", "flag:--lpm-max-wait")),
    Feature("speculative decoding", "no", "yes", "yes", lacks=("speculat", "draft_model", "draft_token")),
    Feature("quantized weights and KV", "no", "yes", "yes", lacks=("quantiz", "fp8", "awq", "gptq")),
    Feature("structured output", "partly", "yes", "yes",
            has=("field:minisgl.core:SamplingParams.json_schema", "src:minisgl.engine.grammar:GrammarManager._get_compiler:cache_enabled=True",
                 "src:minisgl.engine.grammar:GrammarManager.fill:batch_fill_next_token_bitmask"),
            lacks=("compile_regex", "compile_grammar", "ebnf")),
    Feature("n > 1, penalties, logprobs", "yes", "yes", "yes",
            has=("field:minisgl.server.protocol:_Common.n", "sym:minisgl.server.choices:Choice", "field:minisgl.core:SamplingParams.frequency_penalty",
                 "field:minisgl.core:SamplingParams.logprobs")),
    Feature("LoRA adapters", "no", "yes", "yes", lacks=("lora",)),
    Feature("prefill/decode disaggregation", "no", "yes", "yes", lacks=("disagg",)),
    Feature("DP attention, expert parallelism", "no", "yes", "yes", lacks=("dp_attention", "expert_parallel", "all_to_all")),
    Feature("hierarchical / offloaded KV", "no", "yes", "yes", lacks=("hicache", "offload_kv", "host_kv_pool")),
    Feature("metrics and operations", "partly", "yes", "yes",
            has=("route:/metrics", "route:/health", "sym:minisgl.server.drain:DrainingServer", "flag:--drain-timeout"),
            lacks=("field:minisgl.core:SamplingParams.priority", "field:minisgl.server.protocol:_Common.priority", "update_weight")),
)


def _resolve(target: str):
    import importlib

    module, _, qual = target.partition(":")
    obj = importlib.import_module(module)
    for part in qual.split("."):
        obj = getattr(obj, part)
    return obj


def probe(p: str) -> bool:
    """Whether the engine has what probe `p` names (see `Feature`)."""
    import dataclasses
    import inspect

    kind, _, what = p.partition(":")
    if kind == "sym":
        try:
            _resolve(what)
        except (ImportError, AttributeError):
            return False
        return True
    if kind == "field":
        owner, _, name = what.rpartition(".")
        try:
            cls = _resolve(owner)
        except (ImportError, AttributeError):
            return False
        if dataclasses.is_dataclass(cls):
            return name in {f.name for f in dataclasses.fields(cls)}
        return name in getattr(cls, "model_fields", {})
    if kind == "flag":
        from minisgl.server.args import build_parser

        return any(what in a.option_strings for a in build_parser()._actions)
    if kind == "route":
        from minisgl.server.api import create_app
        from minisgl.server.args import ServerArgs

        app = create_app(ServerArgs.from_options(model_path=str(REPO / "models" / "tiny-llama")), None)
        return what in {getattr(r, "path", None) for r in app.routes}
    if kind == "src":
        target, _, text = what.rpartition(":")
        try:
            return text in inspect.getsource(_resolve(target))
        except (ImportError, AttributeError):
            return False
    raise ValueError(f"unknown probe kind {kind!r} in {p!r}: use sym, field, flag, route or src")


def package_sources() -> Dict[str, str]:
    """Relative path -> text of every Python file of the `minisgl` package this process imports."""
    import minisgl

    root = Path(minisgl.__file__).resolve().parent
    return {str(f.relative_to(root.parent)): f.read_text() for f in sorted(root.rglob("*.py"))}


def mentions(word: str) -> List[str]:
    """The package's source files that contain `word` (case-insensitive)."""
    return [path for path, text in package_sources().items() if word.lower() in text.lower()]


def disagreements(features: Sequence[Feature] = FEATURES) -> List[str]:
    """Every mark of minisgl's that the engine contradicts: a piece `has` names that is missing,
    or an entry of `lacks` that is found. Empty when the map is true."""
    out = []
    for f in features:
        out += [f"{f.name}: marked {f.minisgl!r}, but {p} is not in the engine" for p in f.has if not probe(p)]
        for w in f.lacks:
            if _is_probe(w) and probe(w):
                out.append(f"{f.name}: marked {f.minisgl!r}, but {w} is in the engine")
            elif not _is_probe(w) and mentions(w):
                out.append(f"{f.name}: marked {f.minisgl!r}, but {w!r} appears in {', '.join(mentions(w))}")
    return out


def _is_probe(entry: str) -> bool:
    return entry.split(":", 1)[0] in ("sym", "field", "flag", "route", "src")


def evidence_table(features: Sequence[Feature] = FEATURES) -> str:
    """The map as text: minisgl's mark, what in the engine backs it, and which words its source lacks."""
    from figures import table

    def short(p: str) -> str:
        if not _is_probe(p):
            return p
        if p.startswith("src:"):
            return p.rsplit(":", 1)[1]
        return p.split(":")[-1]

    return table([dict(feature=f.name, minisgl=f.minisgl, found_in_the_engine=", ".join(map(short, f.has)) or "-",
                       not_found=", ".join(map(short, f.lacks)) or "-") for f in features])


def package_size() -> Tuple[int, int]:
    """(Python files, lines) of the `minisgl` package this process imports."""
    sources = package_sources()
    return len(sources), sum(len(t.splitlines()) for t in sources.values())


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


@dataclass
class _Waiting:
    req: SimReq
    kept: int = 0  # output tokens it already has (after a retraction)
    passed_over: int = 0  # prefill steps that admitted a request behind it while it was refused


def simulate(reqs: Sequence[SimReq], num_pages: int, max_running: int, ratio: float = 1.0, max_steps: int = 100_000,
             token_budget: Optional[int] = None) -> SimResult:
    """Admit first come, first served while the pool covers every running request's estimated
    future pages plus the newcomer's; `ratio` scales the estimate of the tokens a request has yet
    to produce (1.0: all of `max_tokens`, the engine's reservation). As in the engine's admission
    (`PrefillManager.admit_in_order`), a refused request is passed over and those behind it that
    fit are admitted; the walk stops once no row is free, at a prompt longer than what is left of
    `token_budget` (the prefill tokens of one step, None: no cap; the first prompt of a step joins
    whatever its length), or at a request already passed over `MAX_PASSED_OVER` times.
    When a decode step finds too few free pages, the newest running requests are retracted: their
    pages are freed and they wait at the head of the queue to be prefilled again, output so far
    included."""
    from minisgl.scheduler.prefill import MAX_PASSED_OVER

    assert 0 < ratio <= 1.0
    waiting: List[_Waiting] = [_Waiting(r) for r in reqs]
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
        budget = math.inf if token_budget is None else token_budget
        batch: List[_Live] = []
        refused: List[_Waiting] = []
        passed = 0  # how many of `refused` have a request admitted behind them
        for w in list(waiting):
            if len(live) >= max_running:
                break
            prompt = w.req.prompt + w.kept  # a retracted request recomputes its output so far too
            later = math.ceil(ratio * (w.req.max_tokens - w.kept - 1))  # after the token this prefill samples
            over_budget = bool(batch) and prompt > budget
            if over_budget or free < promised + prompt + later:
                if over_budget or w.passed_over >= MAX_PASSED_OVER:
                    break
                refused.append(w)
                continue
            waiting.remove(w)
            l = live[w.req.uid] = _Live(w.req, prompt, w.kept, w.kept, admitted)
            admitted += 1
            free -= prompt
            promised += later
            budget -= prompt
            recomputed += prompt if w.kept else 0
            batch.append(l)
            passed = len(refused)
        for w in refused[:passed]:
            w.passed_over += 1
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
            waiting.insert(0, _Waiting(newest.req, newest.done))
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


# ---- waiting under a cache-aware order ---------------------------------------------------------

def hit_stream(hits: int, burst: int, every: int, prefix_len: int, tail: int, loner: int,
               seed: int = 0) -> Tuple[List[List[int]], List[int]]:
    """Traffic that keeps a cache-aware order busy: `hits` requests sharing one system prompt, the
    first `burst` at step 0 and then two every `every` steps, and in place `loner` (in arrival
    order) one request that shares nothing with them, arriving with its neighbours. Returns the
    prompts in arrival order and their arrival steps."""
    rng = random.Random(seed)
    prefix = [rng.randrange(10, 5000) for _ in range(prefix_len)]
    prompts = [prefix + [rng.randrange(10, 5000) for _ in range(tail)] for _ in range(hits)]
    prompts.insert(loner, [rng.randrange(10, 5000) for _ in range(prefix_len + tail)])
    return prompts, [0 if i < burst else every * ((i - burst) // 2 + 1) for i in range(len(prompts))]


def serve_arrivals(llm, prompts: Sequence[Sequence[int]], arrivals: Sequence[int], params) -> List[int]:
    """Drive `llm` one step at a time, adding each prompt at the start of its arrival step, until
    every request is done. Returns each request's wait: the steps from its arrival to the step
    that prefills it (0: prefilled in the step it arrived in)."""
    first: Dict[int, int] = {}
    index: Dict[int, int] = {}  # uid -> position in `prompts`
    step = 0
    while len(index) < len(prompts) or not llm.is_idle:
        for i in [i for i, a in enumerate(arrivals) if a == step]:
            index[llm.add_request(prompts[i], params)] = i
        seen = len(llm.trace)
        llm.step()
        for t in llm.trace[seen:]:
            for uid in t.uids if t.phase == "prefill" else ():
                first.setdefault(uid, step)
        step += 1
    for uid in index:
        llm.take_output(uid)
    return [first[uid] - arrivals[i] for uid, i in sorted(index.items(), key=lambda kv: kv[1])]


def waits_figure(waits: Dict[str, Sequence[int]], loner: int, line: int):
    """Each request's wait (steps from arrival to prefill) under each policy, the loner marked and
    a dashed line drawn at `line` steps."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 3.2))
    markers = ["o", "s", "^", "D"]
    for k, (name, w) in enumerate(waits.items()):
        ax.plot(range(len(w)), w, marker=markers[k % 4], linestyle="-", linewidth=0.8, markersize=4, label=name)
    ax.axvline(loner, color="#999999", linestyle=":", linewidth=1)
    ax.annotate("the request with no hit", (loner, 0), xytext=(4, 6), textcoords="offset points", fontsize=8, rotation=90)
    ax.axhline(line, color="#bbbbbb", linestyle="--", linewidth=0.8)
    ax.set_xlabel("request (uid, arrival order)")
    ax.set_ylabel("steps waited before prefill")
    ax.legend(frameon=False, fontsize=8)
    fig.tight_layout()
    return fig
