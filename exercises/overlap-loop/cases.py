"""Cases for overlap-loop: token events and step traces of chapter 11's scheduler (overlap and
chunked prefill and chapter 8's prefix reuse over chapter 7's), with and without overlap, with stop tokens, aborts and results
read before a turn while batches are in flight."""

import random

from judge import harness
from judge.api import E2E, Obs, case
from minisgl.core import SamplingParams


def make_scheduler(config):
    """Chapter 11's scheduler: overlap and chunked prefill and chapter 8's prefix reuse over chapter 7's `Scheduler`, keeping
    each request's tokens and finish reason as `harness.make_scheduler`'s does."""
    from minisgl.scheduler import ChunkedPrefillMixin, OverlapMixin, Scheduler

    return harness.make_scheduler(config, (OverlapMixin, ChunkedPrefillMixin, Scheduler))


def _run(obs: Obs, prompts, params, *, overlap: bool, aborts=None, early_reads=(), max_running: int = 8, budget: int = 8192) -> None:
    """Drive the loop; record every on_token call (step, request, token, finish reason) and the
    trace. Before the turns in `early_reads`, every launched result is read first, as an
    extension that needs the last tokens on the host before scheduling would."""
    cfg = harness.scheduler_config(overlap=overlap, max_running_reqs=max_running, max_extend_tokens=budget)
    sched = make_scheduler(cfg)
    events = []
    plain = type(sched).on_token

    def on_token(req, token, reason):
        events.append([len(sched.trace) - 1, req.uid, token, reason])
        plain(sched, req, token, reason)

    sched.on_token = on_token
    uids = [sched.add_request(p, sp) for p, sp in zip(prompts, params)]
    aborts = aborts or {}
    steps = 0
    while not sched.is_idle:
        if steps in aborts:
            sched.abort_request(uids[aborts[steps]])
        if steps >= 200:
            raise RuntimeError("the scheduler is not idle after 200 steps: a batch is never processed, or a request never finishes")
        if steps in early_reads:
            for older in list(sched.unprocessed):
                sched.process_results(older)
        sched.step()
        steps += 1
    obs.eq("on_token calls in order: [step launched so far, request uid, token, finish reason]", events)
    for i, u in enumerate(uids):
        out = sched.outputs.get(u, harness.Finished())
        obs.eq(f"request {i}: tokens and finish reason", [out.tokens, out.finish_reason])
    harness.record_trace(obs, sched.trace)
    sched.assert_all_free()


@case("two requests, overlap off", hint=1)
def plain_loop(obs: Obs) -> None:
    _run(obs, [[11, 12, 13], [21, 22]], [SamplingParams(max_tokens=3, ignore_eos=True)] * 2, overlap=False)


@case("two requests of different lengths, overlap on", hint=2)
def overlap_two(obs: Obs) -> None:
    _run(obs, [[11, 12, 13], [21, 22]], [SamplingParams(max_tokens=2, ignore_eos=True), SamplingParams(max_tokens=5, ignore_eos=True)], overlap=True)


@case("a stop token ends a request early while the next batch is already launched", hint=3)
def stop_token(obs: Obs) -> None:
    probe = make_scheduler(harness.scheduler_config(overlap=False))
    probe.add_request([11, 12, 13], SamplingParams(max_tokens=6, ignore_eos=True))
    harness.run_until_idle(probe)
    stop = probe.outputs[0].tokens[2]  # the third token this prompt produces
    _run(obs, [[11, 12, 13], [21, 22]], [SamplingParams(max_tokens=6, stop_token_ids=(stop,)), SamplingParams(max_tokens=6, ignore_eos=True)], overlap=True)


@case("a long prompt prefilled in chunks beside decoding requests, overlap on", hint=3)
def chunks(obs: Obs) -> None:
    _run(obs, [[11, 12], list(range(30, 44)), [21, 22, 23]], [SamplingParams(max_tokens=5, ignore_eos=True)] * 3, overlap=True, budget=6)


@case("an abort while the request's batch is in flight", hint=3)
def abort(obs: Obs) -> None:
    _run(obs, [[11, 12, 13], [21, 22], [31]], [SamplingParams(max_tokens=6, ignore_eos=True)] * 3, overlap=True, aborts={3: 1})


@case("results read before a turn while batches are in flight (as an extension may do), overlap on", hint=2)
def early_reads(obs: Obs) -> None:
    params = [SamplingParams(max_tokens=6, ignore_eos=True), SamplingParams(max_tokens=3, ignore_eos=True), SamplingParams(max_tokens=4, ignore_eos=True)]
    _run(obs, [[11, 12, 13], [21, 22], [31, 32, 33, 34]], params, overlap=True, early_reads={2, 3, 5})


@case("sampled tokens (temperature, a seed) and an abort of the first request, overlap on", hint=3)
def sampled_abort(obs: Obs) -> None:
    params = [SamplingParams(max_tokens=5, ignore_eos=True, temperature=0.8, seed=3), SamplingParams(max_tokens=3, ignore_eos=True),
              SamplingParams(max_tokens=6, ignore_eos=True, temperature=0.8, seed=7)]
    _run(obs, [[11, 12, 13], [21, 22], [31]], params, overlap=True, aborts={3: 0})


@case("random requests, stop tokens, aborts and early reads, overlap on", kind=E2E, seeds=2, hint=3)
def random_runs(obs: Obs, seed: int) -> None:
    rng = random.Random(seed)
    n = rng.randint(2, 6)
    prompts = harness.random_prompts(seed, n, lo=1, hi=12)
    params = [SamplingParams(max_tokens=rng.randint(1, 8), ignore_eos=True, temperature=rng.choice([0.0, 0.8]), seed=rng.randrange(1000),
                             stop_token_ids=tuple(rng.randrange(0, 49152) for _ in range(rng.randint(0, 300)))) for _ in range(n)]
    aborts = {rng.randint(0, 8): rng.randrange(n)} if rng.random() < 0.6 else {}
    early = {rng.randint(0, 10) for _ in range(rng.randint(0, 3))}
    _run(obs, prompts, params, overlap=True, aborts=aborts, early_reads=early, max_running=rng.randint(1, 4), budget=rng.randint(4, 32))
