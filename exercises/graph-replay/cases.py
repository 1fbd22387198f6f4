"""Cases for graph-replay: the padded size for every batch size of several ladders, and engine
runs on tiny models whose decode steps are replayed (from emulated graphs on the CPU): the static
buffers after each replay, the logits, and the generated tokens against an eager run."""

import random

import torch

from judge import harness
from judge.api import E2E, Obs, case


def _ladder(obs: Obs, max_bs: int, sizes) -> None:
    from minisgl.engine.graph import GraphRunner, graph_batch_sizes

    runner = GraphRunner.__new__(GraphRunner)  # padded_size needs only the ladder
    runner.bs_list = graph_batch_sizes(max_bs)
    for bs in sizes:
        obs.eq(f"ladder {runner.bs_list[:6]}...{runner.bs_list[-1]}: padded_size({bs})", runner.padded_size(bs))


@case("padded size: batches on and between the rungs", hint=1)
def ladder_small(obs: Obs) -> None:
    _ladder(obs, 8, range(1, 9))
    _ladder(obs, 20, range(1, 21))


@case("padded size: the full ladder up to 256", hint=1)
def ladder_full(obs: Obs) -> None:
    _ladder(obs, 256, range(1, 257))


def _emulated(model: str, max_bs: int = 8, max_running_reqs: int = 8):
    from chapters.stage4 import emulated_graph_runner

    cfg = harness.scheduler_config(model, max_running_reqs=max_running_reqs, num_pages=512, max_seq_len=128)
    sched = harness.make_scheduler(cfg)
    runner = emulated_graph_runner(sched.engine, max_bs)
    return sched, runner


def _run(obs: Obs, model: str, prompts, max_tokens, max_bs: int = 8) -> None:
    from minisgl.core import SamplingParams

    params = [SamplingParams(max_tokens=m, ignore_eos=True) for m in max_tokens]
    eager = harness.make_scheduler(harness.scheduler_config(model, max_running_reqs=8, num_pages=512, max_seq_len=128))
    uids = [eager.add_request(p, sp) for p, sp in zip(prompts, params)]
    harness.run_until_idle(eager)
    expected = [eager.outputs[u].tokens for u in uids]

    sched, runner = _emulated(model, max_bs)
    step = {"n": 0}
    run, support = runner.run, runner.attn_support
    plan = support.prepare_for_replay
    planned, replayed = [], []  # this replay's: sizes the graph support planned, graphs replayed

    def planning(batch, size):
        planned.append(size)
        return plan(batch, size)

    def replayer(size, graph):
        replay = graph.replay

        def counted():
            replayed.append(size)
            replay()
        return counted

    support.prepare_for_replay = planning
    for size, graph in runner.graphs.items():
        graph.replay = replayer(size, graph)

    def recorded(batch):
        bs = batch.size
        planned.clear()
        replayed.clear()
        logits = run(batch)
        pad = replayed[-1] if replayed else bs
        tag = f"decode replay {step['n']} (batch of {bs})"
        obs.eq(f"{tag}: graphs replayed", list(replayed))
        obs.eq(f"{tag}: sizes the graph support planned", sorted(set(planned)))  # planning twice is harmless
        obs.eq(f"{tag}: static out_loc[:replayed size]", runner.out_loc[:pad])
        obs.eq(f"{tag}: static positions[:replayed size]", runner.positions[:pad])
        obs.eq(f"{tag}: static input_ids[:batch size]", runner.input_ids[:bs])
        obs.eq(f"{tag}: shape of the returned logits", list(logits.shape))
        obs.close(f"{tag}: returned logits (first 64 columns)", logits[:, :64])
        step["n"] += 1
        return logits

    runner.run = recorded
    uids = [sched.add_request(p, sp) for p, sp in zip(prompts, params)]
    harness.run_until_idle(sched)
    got = [sched.outputs[u].tokens for u in uids]
    for i, (g, e) in enumerate(zip(got, expected)):
        obs.eq(f"request {i}: tokens with graphs replayed equal the eager run's", g == e)
        obs.eq(f"request {i}: generated token ids", g)
    sched.assert_all_free()


@case("tiny-llama: a batch of 5 shrinking to 1 (graphs 8, 4, 2, 1)", kind=E2E, hint=2, timeout_s=120)
def shrinking(obs: Obs) -> None:
    _run(obs, "tiny-llama", [[10 + i, 20 + i, 30 + i] for i in range(5)], [3 + i for i in range(5)])


@case("tiny-qwen3: exact rung sizes 4 and 8, then leftovers", kind=E2E, hint=3, timeout_s=120)
def exact_rungs(obs: Obs) -> None:
    prompts = [[100 + 7 * i, 5, 6, 7 + i] for i in range(8)]
    _run(obs, "tiny-qwen3", prompts, [4] * 4 + [6] * 2 + [8] * 2)


@case("random prompts and lengths", kind=E2E, seeds=2, hint=4, timeout_s=120)
def random_runs(obs: Obs, seed: int) -> None:
    rng = random.Random(seed)
    n = rng.randint(2, 8)
    prompts = harness.random_prompts(seed, n, lo=2, hi=12)
    _run(obs, "tiny-llama", prompts, [rng.randint(2, 7) for _ in range(n)])
