"""A rollout worker's predicted load, in seconds of decode passes (`pipeline.costs`).

A decode pass over b running requests costs `base_s + per_token_s * scheduled tokens`
(`pipeline.costs.SCHED_COST`: ~18 ms + 0.2 ms per token on this CPU). When every request of a
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

With speculation (`CostModel.speculating` at the worker's request count) a request emits
tau tokens a pass and schedules 1 + draft_tokens, so both terms change:

    (base_s * longest + per_token_s * (1 + draft_tokens) * tokens) / tau

Under the history+group model that weighs every token beside the longest request 5 times
as much against the base cost as without speculation. Placing by the formula without
speculation stacked too much beside the longest requests: the oracle took 761 s on the
production-shaped step at W = 256 where with this one it takes 616 s.
"""

from __future__ import annotations

import heapq
from collections import Counter
from dataclasses import replace

from pipeline.costs import SCHED_COST, CostModel


# What `--spec` means to the simulator. The history+group numbers are placeholders, not a
# measurement of tau per batch size (`rhymectl bench spec` measures it): speculation in the
# thin tail only, where a pass is nearly all fixed overhead.
SPEC_COST_MODELS = {
    "none": SCHED_COST,
    "history+group": replace(SCHED_COST, tau=2.5, draft_tokens=4, spec_max_batch=32),
}


class LoadEstimate:
    """Predicted outstanding seconds per worker; `best` is the worker to add work to.

    Time of a worker = base_s * max(longest, floor, tokens / capacity) + per_token_s *
    tokens, over the predicted lengths of the requests placed on it and not yet `done`.
    """

    def __init__(self, workers: int, cost: CostModel, capacity: int, floor: float = 0.0):
        self.cost, self.capacity, self.floor = cost, capacity, floor
        self.tokens = [0.0] * workers
        self.count = [0] * workers  # outstanding requests
        self.lengths = [[] for _ in range(workers)]  # max-heaps (negated) of outstanding lengths
        self.removed = [Counter() for _ in range(workers)]
        self.unavailable: set[int] = set()
        self._longest: list[float | None] = [0.0] * workers  # longest(w), None: recompute
        self.current = [self.time(w) for w in range(workers)]  # time(w) as of its last change
        self.heap = [(t, w) for w, t in enumerate(self.current)]  # (time, worker); stale skipped

    def longest(self, w: int) -> float:
        cached = self._longest[w]
        if cached is not None:
            return cached
        heap, removed = self.lengths[w], self.removed[w]
        while heap and removed[-heap[0]]:
            removed[-heap[0]] -= 1
            heapq.heappop(heap)
        self._longest[w] = out = -heap[0] if heap else 0.0
        return out

    def time(self, w: int) -> float:
        return self._time(self.longest(w), self.tokens[w], self.count[w])

    def time_with(self, w: int, length: float) -> float:
        """The worker's predicted time if one more request of `length` were placed on it."""
        return self._time(max(self.longest(w), length), self.tokens[w] + length, self.count[w] + 1)

    def _time(self, longest: float, tokens: float, count: int) -> float:
        cost = self.cost
        per_pass = cost.tokens_per_pass(count)  # tau while speculating at this batch, else 1
        scheduled = cost.scheduled_per_request(count)
        passes = max(longest, self.floor, tokens / self.capacity) / per_pass
        return cost.base_s * passes + cost.per_token_s * scheduled * tokens / per_pass

    def add(self, w: int, length: float, count: int = 1) -> None:
        self.tokens[w] += length * count
        self.count[w] += count
        length = float(length)
        for _ in range(count):
            heapq.heappush(self.lengths[w], -length)
        cached = self._longest[w]
        if cached is not None and length > cached:
            self._longest[w] = length
        self._push(w)

    def done(self, w: int, length: float) -> None:
        """One request of predicted `length` placed on `w` finished."""
        self.tokens[w] = max(0.0, self.tokens[w] - length)
        self.count[w] = max(0, self.count[w] - 1)
        self.removed[w][float(length)] += 1
        if length >= (self._longest[w] or 0.0):
            self._longest[w] = None  # the longest may have left
        self._push(w)

    def best(self) -> int | None:
        """The available worker with the least predicted time (lowest index on ties)."""
        heap = self.heap
        while heap:
            t, w = heap[0]
            if w in self.unavailable or t != self.current[w]:
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
        self.current[w] = t = self.time(w)
        heapq.heappush(self.heap, (t, w))


__all__ = ["LoadEstimate", "SPEC_COST_MODELS"]
