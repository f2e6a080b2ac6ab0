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

from pipeline.history.lengths import LengthEvidence

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
    """The remaining-length estimate of running requests over a prompt's length evidence
    (`pipeline.history.lengths.LengthEvidence`: its history and its siblings that finished
    this step), cached per request: an estimate changes only when the evidence does or the
    request outgrows the smallest sample above it."""

    def __init__(self, evidence: LengthEvidence):
        self.evidence = evidence
        self._samples: dict[str, tuple[int, LengthSamples]] = {}  # key -> (version, samples)
        self._pool: tuple[int, LengthSamples] | None = None  # (history version, samples)
        self._cache: dict = {}  # req -> ((prompt version, pool version), until, total, std)

    def forget(self, req_id) -> None:
        self._cache.pop(req_id, None)

    def estimate_many(self, items) -> list[tuple[float, float]]:
        """`estimate` for (req_id, key, generated) triples; the cached case inlined (it is
        most rows of most passes)."""
        ev = self.evidence
        cache, version, pool, out = self._cache, ev.version, ev.history_version, []
        for req_id, key, generated in items:
            hit = cache.get(req_id)
            if hit is not None and generated < hit[1] and hit[0] == (version(key), pool):
                rem = hit[2] - generated
                out.append((rem if rem > MIN_REMAINING else MIN_REMAINING, hit[3]))
            else:
                out.append(self.estimate(req_id, key, generated))
        return out

    def estimate(self, req_id, key: str, generated: int) -> tuple[float, float]:
        """(mean, std) remaining tokens of a running request of prompt `key`."""
        ev = self.evidence
        hit = self._cache.get(req_id)
        version = (ev.version(key), ev.history_version)
        if hit is not None and hit[0] == version and generated < hit[1]:
            return max(hit[2] - generated, MIN_REMAINING), hit[3]
        held = self._samples.get(key)
        if held is None or held[0] != version[0]:
            held = self._samples[key] = (version[0], LengthSamples(ev.lengths(key)))
        if self._pool is None or self._pool[0] != version[1]:
            self._pool = (version[1], LengthSamples(list(ev.history_lengths())))
        mean, std, until = remaining(generated, held[1], self._pool[1])
        self._cache[req_id] = (version, until, mean + generated, std)
        return mean, std


__all__ = ["LengthSamples", "RemainingTracker", "remaining"]
