"""What a rollout worker's time costs: decode passes, and a worker's predicted load.

A decode pass over b running requests costs `base_s + per_token_s * scheduled tokens`
(measured on this CPU, issue 5: ~18 ms + 0.2 ms per token). When every request of a
worker runs at once, the worker needs as many passes as its longest request and each
token costs per_token_s once, so its time is about

    base_s * longest + per_token_s * tokens

(with a concurrency cap C, at least tokens / C passes). Balancing that, rather than token
counts, is what gets a step to its bound: the worker holding the longest request must
carry little else, because every token beside it lengthens each of its passes. But a
worker holding k requests will probably hold one as long as the (1 - 1/k) quantile of the
response lengths whatever the predictions say (siblings vary; on the default workload
every worker gets a response that hits max_tokens), so predicted lengths below that
`floor` do not count as a worker's longest: there, balancing tokens is what matters.
"""

from __future__ import annotations

import heapq
from collections import Counter
from dataclasses import dataclass


@dataclass(frozen=True)
class CostModel:
    """Seconds per decode pass as a function of the batch size.

    Speculation (tau > 1) emits tau tokens per request per pass on average and schedules
    1 + draft_tokens tokens per request, at batch sizes up to spec_max_batch only (None:
    at every size).
    """

    base_s: float = 0.018
    per_token_s: float = 0.0002
    tau: float = 1.0
    draft_tokens: int = 0
    spec_max_batch: int | None = None

    def __post_init__(self):
        if self.base_s < 0 or self.per_token_s < 0 or self.base_s + self.per_token_s <= 0:
            raise ValueError(f"pass costs must be >= 0 and not both 0, got base_s={self.base_s}, "
                             f"per_token_s={self.per_token_s}")
        if self.tau < 1:
            raise ValueError(f"tau must be >= 1 (tokens per pass), got {self.tau}")
        if self.draft_tokens < 0:
            raise ValueError(f"draft_tokens must be >= 0, got {self.draft_tokens}")

    def speculating(self, batch: int) -> bool:
        return self.tau > 1 and (self.spec_max_batch is None or batch <= self.spec_max_batch)

    def pass_s(self, batch: int) -> float:
        per_request = 1 + self.draft_tokens if self.speculating(batch) else 1
        return self.base_s + self.per_token_s * batch * per_request

    def tokens_per_pass(self, batch: int) -> float:
        return self.tau if self.speculating(batch) else 1.0

    def rate(self, batch: int) -> float:
        """Tokens per second gained by each of `batch` running requests."""
        return self.tokens_per_pass(batch) / self.pass_s(batch)


# What `--spec` means to the simulator. The history+group numbers are placeholders until
# `rhymectl bench spec` measures tau per batch size (issue 4): speculation in the thin tail
# only, where a pass is nearly all fixed overhead.
SPEC_COST_MODELS = {
    "none": CostModel(),
    "history+group": CostModel(tau=2.5, draft_tokens=4, spec_max_batch=32),
}


class LoadEstimate:
    """Predicted outstanding seconds per worker; `best` is the worker to add work to.

    Time of a worker = base_s * max(longest, floor, tokens / capacity) + per_token_s *
    tokens, over the predicted lengths of the requests placed on it and not yet `done`.
    """

    def __init__(self, workers: int, cost: CostModel, capacity: int, floor: float = 0.0):
        self.cost, self.capacity, self.floor = cost, capacity, floor
        self.tokens = [0.0] * workers
        self.lengths = [[] for _ in range(workers)]  # max-heaps (negated) of outstanding lengths
        self.removed = [Counter() for _ in range(workers)]
        self.unavailable: set[int] = set()
        self.heap = [(self.time(w), w) for w in range(workers)]  # (time, worker); stale skipped

    def longest(self, w: int) -> float:
        heap, removed = self.lengths[w], self.removed[w]
        while heap and removed[-heap[0]]:
            removed[-heap[0]] -= 1
            heapq.heappop(heap)
        return -heap[0] if heap else 0.0

    def time(self, w: int) -> float:
        tokens = self.tokens[w]
        passes = max(self.longest(w), self.floor, tokens / self.capacity)
        return self.cost.base_s * passes + self.cost.per_token_s * tokens

    def add(self, w: int, length: float, count: int = 1) -> None:
        self.tokens[w] += length * count
        heapq.heappush(self.lengths[w], -float(length))
        for _ in range(count - 1):
            heapq.heappush(self.lengths[w], -float(length))
        self._push(w)

    def done(self, w: int, length: float) -> None:
        """One request of predicted `length` placed on `w` finished."""
        self.tokens[w] = max(0.0, self.tokens[w] - length)
        self.removed[w][float(length)] += 1
        self._push(w)

    def best(self) -> int | None:
        """The available worker with the least predicted time (lowest index on ties)."""
        heap = self.heap
        while heap:
            t, w = heap[0]
            if w in self.unavailable or t != self.time(w):
                heapq.heappop(heap)
                continue
            return w
        return None

    def set_available(self, w: int, available: bool) -> None:
        if available:
            if w in self.unavailable:
                self.unavailable.discard(w)
                self._push(w)
        else:
            self.unavailable.add(w)

    def _push(self, w: int) -> None:
        heapq.heappush(self.heap, (self.time(w), w))


__all__ = ["CostModel", "LoadEstimate", "SPEC_COST_MODELS"]
