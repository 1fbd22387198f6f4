"""Cases for chunk-size: prefill schedules of long prompts under small budgets; TTFT in steps."""

import random

from judge import harness
from judge.api import E2E, Obs, case
from minisgl.core import SamplingParams
from minisgl.scheduler.chunked import ChunkedPrefillManager


def _schedule(obs: Obs, budget: int, prompts, rows: int = 4, num_pages: int = 256, arrivals=None, max_steps: int = 60, warm=()) -> None:
    """Prefill-only scheduling without a model: every batch is allocated and launched at once.
    `warm`: token sequences put in the prefix cache first."""
    table, cache = harness.managers(rows=rows, num_pages=num_pages, max_seq_len=256)
    for ids in warm:
        harness.cache_prefix(cache, ids)
    pm = ChunkedPrefillManager(table, cache, budget)
    arrivals = arrivals or [0] * len(prompts)
    live = []
    for step in range(max_steps):
        harness.arrive(pm, step, prompts, arrivals, max_tokens=2)
        reserved = sum(cache.pages_to_finish(r) for r in live)
        batch = pm.schedule_next_batch(reserved)
        if batch is None:
            if not pm.pending and step >= max(arrivals):
                break
            obs.eq(f"step {step}: batch", None)
            continue
        obs.eq(f"step {step}: (uid, cached_len, extend_len) per request",
               [[r.uid, r.cached_len, r.extend_len] for r in batch.reqs])
        obs.eq(f"step {step}: the request left half done", pm.chunked.uid if pm.chunked else None)
        cache.allocate(batch.reqs)
        for r in batch.reqs:
            r.complete_one()
            if r not in live:
                live.append(r)
    obs.eq("prompts fully prefilled", sorted(r.uid for r in live if not r.is_chunk and r.cached_len >= r.prompt_len))


@case("short prompts all fit in one batch", hint=1)
def fits(obs: Obs) -> None:
    _schedule(obs, 64, [list(range(10, 20)), list(range(30, 35))])


@case("one 30-token prompt with a budget of 8", hint=2)
def one_long(obs: Obs) -> None:
    _schedule(obs, 8, [list(range(10, 40))])


@case("a long prompt, then short ones arriving while it is chunked", hint=3)
def mixed(obs: Obs) -> None:
    _schedule(obs, 10, [list(range(10, 35)), [5, 6, 7], list(range(40, 52))], arrivals=[0, 1, 1])


@case("beside a chunk, a newcomer with a cached prefix leaves budget over, but the next one still waits", hint=3)
def share_with_hit(obs: Obs) -> None:
    # budget 10: the half-done prompt leaves 5 for [5..9], whose first 4 tokens are cached; the
    # 4 tokens left over must not start a second chunk of the 12-token prompt behind it
    _schedule(obs, 10, [list(range(10, 35)), [5, 6, 7, 8, 9], list(range(40, 52))], arrivals=[0, 1, 1], warm=[[5, 6, 7, 8]])


@case("random prompts, budgets and arrivals", seeds=4, hint=3)
def random_runs(obs: Obs, seed: int) -> None:
    rng = random.Random(seed)
    n = rng.randint(1, 5)
    prompts = [[rng.randrange(10, 99) for _ in range(rng.randint(1, 40))] for _ in range(n)]
    budget = rng.randint(1, 24)
    obs.eq("scenario: budget and prompt lengths", [budget, [len(p) for p in prompts]])
    _schedule(obs, budget, prompts, rows=rng.randint(1, 4), arrivals=sorted(rng.randint(0, 6) for _ in range(n)))


def make_scheduler(config):
    """Chapter 10's scheduler: chunked prefill and chapter 8's prefix reuse over chapter 7's `Scheduler`, keeping each request's
    tokens and finish reason as `harness.make_scheduler`'s does."""
    from minisgl.scheduler import ChunkedPrefillMixin, Scheduler

    class Recording(ChunkedPrefillMixin, Scheduler):
        def __init__(self, cfg):
            super().__init__(cfg)
            self.outputs = {}

        def on_token(self, req, token, finish_reason):
            out = self.outputs.setdefault(req.uid, harness.Finished())
            if token is not None:
                out.tokens.append(int(token))
            out.finish_reason = finish_reason

    return Recording(config)


def _ttft(obs: Obs, budget: int) -> None:
    """Run the engine and record, per request, the step of its first token (TTFT in steps)."""
    from judge.harness import run_until_idle, scheduler_config

    prompts = harness.random_prompts(seed=21, n=3, lo=20, hi=40)
    sched = make_scheduler(scheduler_config(max_extend_tokens=budget))
    uids = [sched.add_request(p, SamplingParams(max_tokens=4, ignore_eos=True)) for p in prompts]
    run_until_idle(sched)
    first = {}
    for t in sched.trace:
        for uid, ext, cached in zip(t.uids, t.extend_lens, t.cached_lens):
            if uid not in first and cached + ext >= len(prompts[uid]):
                first[uid] = t.step
    obs.eq(f"budget {budget}: step of each request's first token", [first.get(u) for u in uids])
    obs.eq(f"budget {budget}: token ids", [sched.outputs[u].tokens for u in uids])
    harness.record_trace(obs, sched.trace)
    sched.assert_all_free()


@case("tiny-llama: the same prompts with budgets of 8, 32 and 512 tokens", kind=E2E, hint=3)
def engine(obs: Obs) -> None:
    for budget in (8, 32, 512):
        _ttft(obs, budget)
