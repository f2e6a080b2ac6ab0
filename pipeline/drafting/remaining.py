"""Predicted remaining response length of a running request, from evidence about its
prompt: earlier epochs' responses to it (RhymeRL: a prompt's length barely moves between
epochs) and its siblings that already finished this step (Seer's probe).

Given the lengths L_1..L_n seen for the prompt and g tokens generated so far, the
remaining length is estimated from the samples that outlive the request so far:
E[L - g | L > g] and its standard deviation (a survival estimate: a request that ran
past most of its history is predicted to end soon, one still short of all of it to run
as long as its history did). With no sample above g it falls back to the pool of all
prompts' lengths, then to g itself (a request is expected to run about as long again as
it has run, with that much spread). Pure logic. Units: tokens.
"""

from __future__ import annotations

from bisect import bisect_right
from typing import Sequence

MIN_REMAINING = 1.0


class LengthSamples:
    """Sorted lengths with suffix sums: the conditional mean/std above any g in O(log n)."""

    __slots__ = ("lengths", "_sum", "_sq")

    def __init__(self, lengths: Sequence[int]):
        self.lengths = sorted(float(x) for x in lengths)
        n = len(self.lengths)
        self._sum = [0.0] * (n + 1)
        self._sq = [0.0] * (n + 1)
        for i in range(n - 1, -1, -1):
            x = self.lengths[i]
            self._sum[i] = self._sum[i + 1] + x
            self._sq[i] = self._sq[i + 1] + x * x

    def __len__(self) -> int:
        return len(self.lengths)

    def above(self, g: float) -> tuple[int, float, float, float]:
        """(count, mean, std, next) of the samples > g; next: the smallest of them (the
        estimate holds until g reaches it)."""
        i = bisect_right(self.lengths, g)
        k = len(self.lengths) - i
        if not k:
            return 0, 0.0, 0.0, float("inf")
        mean = self._sum[i] / k
        var = max(self._sq[i] / k - mean * mean, 0.0)
        return k, mean, var ** 0.5, self.lengths[i]


def remaining(generated: float, prompt: LengthSamples | None,
              pool: LengthSamples | None = None) -> tuple[float, float, float]:
    """(mean, std, valid_until) of the remaining tokens of a request that generated
    `generated` tokens. valid_until: the mean total stays the same until `generated`
    reaches it (callers may cache mean + generated until then)."""
    for samples in (prompt, pool):
        if samples is not None and len(samples):
            k, mean, std, nxt = samples.above(generated)
            if k:
                if k == 1:  # one sample: its spread is unknown, take half its remainder
                    std = 0.5 * (mean - generated)
                return max(mean - generated, MIN_REMAINING), std, nxt
    guess = max(float(generated), 8.0)
    return guess, guess, generated + 1





class RemainingTracker:
    """Per prompt: its history's response lengths and the lengths of its siblings that
    finished this step; per running request, the cached estimate (it changes only when
    the evidence does or the request outgrows the smallest sample above it)."""

    def __init__(self):
        self._history: dict[str, list[int]] = {}
        self._finished: dict[str, list[int]] = {}
        self._samples: dict[str, LengthSamples] = {}
        self._pool: LengthSamples | None = None
        self._versions: dict[str, int] = {}  # per prompt, bumped when its evidence changes
        self._pool_version = 0
        self._cache: dict = {}  # req -> ((prompt version, pool version), until, total, std)

    def set_history(self, key: str, lengths: Sequence[int]) -> None:
        self._history[key] = list(lengths)
        self._changed(key)
        self._pool = None
        self._pool_version += 1

    def finished(self, key: str, length: int) -> None:
        """A request of prompt `key` finished this step with `length` output tokens."""
        self._finished.setdefault(key, []).append(int(length))
        self._changed(key)

    def end_group(self, key: str) -> None:
        if self._finished.pop(key, None) is not None:
            self._changed(key)

    def forget(self, req_id) -> None:
        self._cache.pop(req_id, None)

    def estimate_many(self, items) -> list[tuple[float, float]]:
        """`estimate` for (req_id, key, generated) triples; the cached case inlined (it is
        most rows of most passes)."""
        cache, versions, pool, out = self._cache, self._versions, self._pool_version, []
        for req_id, key, generated in items:
            hit = cache.get(req_id)
            if hit is not None and generated < hit[1] and hit[0] == (versions.get(key, 0), pool):
                rem = hit[2] - generated
                out.append((rem if rem > MIN_REMAINING else MIN_REMAINING, hit[3]))
            else:
                out.append(self.estimate(req_id, key, generated))
        return out

    def estimate(self, req_id, key: str, generated: int) -> tuple[float, float]:
        """(mean, std) remaining tokens of a running request of prompt `key`."""
        hit = self._cache.get(req_id)
        version = (self._versions.get(key, 0), self._pool_version)
        if hit is not None and hit[0] == version and generated < hit[1]:
            return max(hit[2] - generated, MIN_REMAINING), hit[3]
        samples = self._samples.get(key)
        if samples is None:
            samples = self._samples[key] = LengthSamples(
                self._history.get(key, []) + self._finished.get(key, []))
        if self._pool is None:
            self._pool = LengthSamples([x for ls in self._history.values() for x in ls])
        mean, std, until = remaining(generated, samples, self._pool)
        self._cache[req_id] = (version, until, mean + generated, std)
        return mean, std

    def _changed(self, key: str) -> None:
        self._samples.pop(key, None)
        self._versions[key] = self._versions.get(key, 0) + 1
__all__ = ["LengthSamples", "RemainingTracker", "remaining"]
