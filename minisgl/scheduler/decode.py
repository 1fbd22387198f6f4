"""The running set: requests past prefill that still have tokens to generate."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Optional

from minisgl.core import Batch, Req


@dataclass
class DecodeManager:
    running: Dict[int, Req] = field(default_factory=dict)  # uid -> req

    def add(self, reqs: Iterable[Req]) -> None:
        for r in reqs:
            if r.can_decode:
                self.running[r.uid] = r

    def remove(self, req: Req) -> None:
        self.running.pop(req.uid, None)

    def schedule_next_batch(self) -> Optional[Batch]:
        # sorted by uid: the same running set always gives the same batch, whatever the order of arrival
        reqs: List[Req] = [r for _, r in sorted(self.running.items()) if r.can_decode]
        for r in list(self.running.values()):
            if not r.can_decode:
                self.remove(r)
        return Batch(reqs=reqs, phase="decode") if reqs else None

    @property
    def reqs(self) -> List[Req]:
        return list(self.running.values())
