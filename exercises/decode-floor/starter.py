"""Exercise decode-floor (chapter 21): the bytes a decode phase must read at the least.

Write `decode_bytes`. `Workload` is the engine's; the offline benchmark divides your count by the
card's measured copy rate to print its floor. Grade with `python judge.py decode-floor`.
"""

import numpy as np  # noqa: F401  (a loop is fine too)

from minisgl.benchmark.offline import Workload


def decode_bytes(workload: Workload, weight_bytes: int, kv_bytes_per_token: int) -> int:
    """Bytes the decode phase of `workload` must read at the least, as a Python int.

    The floor's schedule: all prompts are prefilled first (that pass gives every request its first
    token), then decode steps 1, 2, ... run until the longest request has all its tokens. Request i
    (`len(workload.prompts[i])` prompt tokens, `workload.max_tokens[i]` tokens to produce) takes
    part in every decode step until it has produced its `max_tokens`. A decode step reads every
    weight once (`weight_bytes`) and, for each request in it, the KV of every position its
    attention reads: the prompt and every token generated so far (the newest is the step's input),
    `kv_bytes_per_token` bytes each.
    """
    raise NotImplementedError("decode-floor: write decode_bytes")
