"""Cases for overlap-loop: token events and step traces of the scheduler, with and without overlap;
the engine's JSON grammars and log-probabilities must keep working around the learner's loop."""

import json
import random

import torch

from judge import harness
from judge.api import E2E, Obs, case
from minisgl.core import SamplingParams


def make_scheduler(config):
    """The engine's complete scheduler (every extension over chapter 7's `Scheduler`: chunked
    prefill, overlap, grammars, log-probabilities), keeping each request's tokens and finish reason
    as `harness.make_scheduler`'s does."""
    from minisgl.scheduler import scheduler_bases

    class Recording(*scheduler_bases()):
        def __init__(self, cfg):
            super().__init__(cfg)
            self.outputs = {}

        def on_token(self, req, token, finish_reason):
            out = self.outputs.setdefault(req.uid, harness.Finished())
            if token is not None:
                out.tokens.append(int(token))
            out.finish_reason = finish_reason

        def on_finish_unstarted(self, uid, reason):
            self.outputs.setdefault(uid, harness.Finished()).finish_reason = reason

    return Recording(config)


def _run(obs: Obs, prompts, params, *, overlap: bool, aborts=None, max_running: int = 8, budget: int = 8192) -> None:
    """Drive the loop; record every on_token call (step, request, token, finish reason), the
    log-probabilities of the requests that ask for them, and the trace."""
    cfg = harness.scheduler_config(overlap=overlap, max_running_reqs=max_running, max_extend_tokens=budget)
    sched = make_scheduler(cfg)
    events, reqs = [], {}
    plain = type(sched).on_token

    def on_token(req, token, reason):
        events.append([len(sched.trace) - 1, req.uid, token, reason])
        reqs[req.uid] = req
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
        sched.step()
        steps += 1
    obs.eq("on_token calls in order: [step launched so far, request uid, token, finish reason]", events)
    for i, u in enumerate(uids):
        out = sched.outputs.get(u, harness.Finished())
        obs.eq(f"request {i}: tokens and finish reason", [out.tokens, out.finish_reason])
        if params[i].logprobs >= 0:
            lp = reqs[u].token_logprobs if u in reqs else []
            obs.eq(f"request {i}: number of log-probability entries (one per output token)", len(lp))
            obs.close(f"request {i}: each output token's log-probability", torch.tensor([c for c, _ in lp]))
            obs.eq(f"request {i}: the top {params[i].logprobs} alternatives' token ids per output token", [[t for t, _ in top] for _, top in lp])
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


# a schema xgrammar forces to `{"ok": true}` or `{"ok": false}`, so the request ends by itself
# after a few tokens (end of sequence is all the grammar allows once the object is closed)
OK_SCHEMA = json.dumps({"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"], "additionalProperties": False})


@case("JSON-constrained requests beside a plain one, overlap on (the engine reads before scheduling)", hint=2, timeout_s=120)
def json_constrained(obs: Obs) -> None:
    params = [SamplingParams(max_tokens=24, json_mode="schema", json_schema=OK_SCHEMA), SamplingParams(max_tokens=12, ignore_eos=True),
              SamplingParams(max_tokens=6, json_mode="object")]
    _run(obs, [[11, 12, 13], [21, 22], [31, 32, 33, 34]], params, overlap=True)


@case("log-probabilities of every output token, overlap on (the engine attaches them in accept_token)", hint=3)
def logprobs(obs: Obs) -> None:
    params = [SamplingParams(max_tokens=5, ignore_eos=True, logprobs=3), SamplingParams(max_tokens=3, ignore_eos=True),
              SamplingParams(max_tokens=6, ignore_eos=True, logprobs=0, temperature=0.8, seed=7)]
    _run(obs, [[11, 12, 13], [21, 22], [31]], params, overlap=True, aborts={3: 0})


@case("random requests, stop tokens and aborts, overlap on", kind=E2E, seeds=2, hint=3)
def random_runs(obs: Obs, seed: int) -> None:
    rng = random.Random(seed)
    n = rng.randint(2, 6)
    prompts = harness.random_prompts(seed, n, lo=1, hi=12)
    params = [SamplingParams(max_tokens=rng.randint(1, 8), ignore_eos=True, temperature=rng.choice([0.0, 0.8]), seed=rng.randrange(1000),
                             stop_token_ids=tuple(rng.randrange(0, 49152) for _ in range(rng.randint(0, 300)))) for _ in range(n)]
    aborts = {rng.randint(0, 8): rng.randrange(n)} if rng.random() < 0.6 else {}
    _run(obs, prompts, params, overlap=True, aborts=aborts, max_running=rng.randint(1, 4), budget=rng.randint(4, 32))
