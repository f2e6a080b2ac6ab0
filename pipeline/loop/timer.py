"""Named phases, each timed: the RL step reads as a sequence of `with phases("name"):`."""

from __future__ import annotations

import time
from contextlib import contextmanager


class PhaseTimer:
    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextmanager
    def __call__(self, name: str):
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start

    def as_metrics(self) -> dict[str, float]:
        return {f"time_{k}_s": round(v, 4) for k, v in self.seconds.items()}
