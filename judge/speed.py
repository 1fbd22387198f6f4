"""Time the learner's piece against the engine's own, in one process on one device.

Run only after every case has passed: the timing cases run again, alternately with the learner's
definitions and with the engine's, while a stopwatch around each timed symbol adds up the time
spent inside it (outermost calls only, with the GPU synchronised at both ends). Rounds repeat
for a few seconds and each side keeps its best round (as `timeit` does): on a shared machine the
best round is the one least disturbed, so a slow start or a busy moment does not count.
"""

from __future__ import annotations

import contextlib
import io
import os
import time
from typing import Any, Callable, Dict, List, Tuple

from .api import Exercise, Obs
from .install import Installed, resolve_owner, swap

MIN_ROUNDS, MAX_ROUNDS = 3, 200
BUDGET_S = 4.0  # stop adding rounds after this long (once MIN_ROUNDS of each side have run)


class _Stopwatch:
    def __init__(self, sync: Callable[[], None]) -> None:
        self.seconds, self.calls, self._depth, self._sync = 0.0, 0, 0, sync

    def wrap(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            if self._depth:
                return fn(*args, **kwargs)
            self._depth += 1
            self._sync()
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self._sync()
                self.seconds += time.perf_counter() - t0
                self.calls += 1
                self._depth -= 1

        timed.__name__ = getattr(fn, "__name__", "timed")
        return timed


def _with_stopwatches(side: Dict[Tuple[Any, str], Any], timed: Dict[str, Tuple[Any, str]], sync) -> Tuple[Dict, Dict[str, _Stopwatch]]:
    pieces, watches = dict(side), {}
    for qualname, key in timed.items():
        value = side[key]
        inner = value.__func__ if isinstance(value, staticmethod) else value
        watches[qualname] = w = _Stopwatch(sync)
        pieces[key] = staticmethod(w.wrap(inner)) if isinstance(value, staticmethod) else w.wrap(inner)
    return pieces, watches


def measure(ex: Exercise, cases: List[Tuple[Any, Dict[str, Any]]], installed: Installed, run_case) -> Dict[str, Dict[str, float]]:
    """{qualname: {"yours": s, "reference": s, "calls": n, "rounds": r}}: the best round's seconds
    inside each timed symbol over the timing cases, for the learner's definitions and the engine's."""
    import torch

    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    timed = {}
    for rep in ex.replaces:
        key = (resolve_owner(rep), rep.attr)
        if rep.qualname in ex.timed and key in installed.learner:
            timed[rep.qualname] = key
    totals: Dict[str, Dict[str, List[float]]] = {q: {"yours": [], "reference": []} for q in timed}
    calls: Dict[str, int] = {}
    t_start = time.perf_counter()
    rounds = 0
    for rnd in range(MAX_ROUNDS):
        order = ("yours", "reference") if rnd % 2 == 0 else ("reference", "yours")
        for side in order:
            pieces, watches = _with_stopwatches(installed.learner if side == "yours" else installed.engine, timed, sync)
            swap(pieces)
            try:
                with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                    for case, item in cases:
                        run_case(case, item, Obs())
            finally:
                swap(installed.learner)
            for q, w in watches.items():
                totals[q][side].append(w.seconds)
                calls[q] = w.calls
        rounds = rnd + 1
        if rounds >= MIN_ROUNDS and time.perf_counter() - t_start > BUDGET_S:
            break
    return {q: {"yours": min(t["yours"]), "reference": min(t["reference"]), "calls": calls.get(q, 0), "rounds": rounds}
            for q, t in totals.items()}


def describe(qualname: str, timing: Dict[str, float], device: str) -> str:
    """'your store_kv: 1.30x the reference's time (...)', for the learner."""
    yours, ref, calls = timing["yours"], timing["reference"], int(timing["calls"])
    name = qualname.split(".")[-1]
    if calls == 0 or ref <= 0:
        return f"your {name}: not called by the timing cases, so not timed"
    ratio = yours / ref
    per = lambda s: f"{s / calls * 1e3:.3g} ms"  # noqa: E731
    return (f"your {name}: {ratio:.2f}x the reference's time ({per(yours)} vs {per(ref)} per call over {calls} calls, "
            f"best of {int(timing.get('rounds', 1))} rounds each, measured in this run on {device})")


def busy_machine() -> str:
    """A caution when other work shared the CPU during the timing (the figures are then noisy)."""
    try:
        load = os.getloadavg()[0]
    except OSError:
        return ""
    cores = os.cpu_count() or 1
    if load <= cores:
        return ""
    return f"the machine was busy while timing (load {load:.1f} on {cores} cores): these ratios are rough; grade again when it is idle"
