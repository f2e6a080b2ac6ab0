"""An online model of one target forward pass's cost: seconds as a function of the
scheduled tokens, refitted from the engine's pass meter while the rollout runs.

Why concave and piecewise. On this CPU a decode pass costs about 5 ms at 5 tokens, 18 ms
at 128 and 61 ms at 860 (compute-bound, the marginal token getting cheaper); on a GPU the
curve is flat up to large batches (memory-bound) and then rises. One line through the
origin fits neither, and a constant fitted on one machine is wrong by orders of magnitude
on another. So the model holds no machine constants:

- samples (scheduled tokens x, seconds t) go into log2-spaced bins of x; each bin keeps
  the median of its last `window` samples (robust to a GC pause or another process);
- the curve is the least concave majorant of the bin points (upper hull), with negative
  slopes clamped to 0 (more tokens never cost less), interpolated linearly and
  extrapolated with the last segment's slope; it is positive wherever a sample was;
- with a single bin, the prior is t0 * sqrt(x / x0) through that first measured point:
  concave, between a flat GPU curve and a linear CPU one; with no sample at all the cost
  is unknown and `known` is False (callers then treat passes as flat).

Units: tokens, seconds. Pure logic, no vLLM.
"""

from __future__ import annotations

import math
from collections import deque
from statistics import median

MAX_BINS = 24  # log2 bins: 1 .. 2**23 tokens


class PassCost:
    """Seconds of one forward pass as a concave, non-decreasing function of its tokens."""

    def __init__(self, window: int = 15, refit_every: int = 4):
        if window < 1 or refit_every < 1:
            raise ValueError(f"window and refit_every must be >= 1, got {window}, {refit_every}")
        self.window, self.refit_every = window, refit_every
        self._bins: dict[int, tuple[deque, deque]] = {}  # bin -> (tokens, seconds)
        self._pending = 0
        self._xs: list[float] = []  # hull points, increasing x
        self._ys: list[float] = []

    @property
    def known(self) -> bool:
        return bool(self._bins)

    def observe(self, tokens: float, seconds: float) -> None:
        """One measured pass. Non-positive or non-finite samples are ignored."""
        if not (tokens > 0 and seconds > 0 and math.isfinite(seconds)):
            return
        b = min(int(math.log2(tokens)), MAX_BINS - 1)
        xs, ts = self._bins.setdefault(b, (deque(maxlen=self.window), deque(maxlen=self.window)))
        xs.append(float(tokens))
        ts.append(float(seconds))
        self._pending += 1
        if self._pending >= self.refit_every or len(self._xs) < 2:
            self.refit()

    def refit(self) -> None:
        """Recompute the hull from the bins (done every `refit_every` samples)."""
        self._pending = 0
        pts = sorted((median(xs), median(ts)) for xs, ts in self._bins.values())
        self._xs, self._ys = _concave_majorant(pts)

    def points(self) -> list[tuple[float, float]]:
        """The fitted curve's knots (tokens, seconds)."""
        return list(zip(self._xs, self._ys))

    def seconds(self, tokens: float) -> float:
        """Predicted seconds of a pass with `tokens` scheduled tokens (0.0 while unknown)."""
        xs, ys = self._xs, self._ys
        if not xs:
            return 0.0
        x = max(float(tokens), 1e-9)
        if len(xs) == 1:
            return ys[0] * math.sqrt(x / xs[0])
        if x <= xs[0]:  # below the smallest bin: the first segment, never below 0
            slope = (ys[1] - ys[0]) / (xs[1] - xs[0])
            return max(ys[0] - slope * (xs[0] - x), ys[0] * 0.5 * x / xs[0], 1e-9)
        for i in range(1, len(xs)):
            if x <= xs[i]:
                w = (x - xs[i - 1]) / (xs[i] - xs[i - 1])
                return ys[i - 1] + w * (ys[i] - ys[i - 1])
        slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])
        return ys[-1] + slope * (x - xs[-1])

    def marginal(self, tokens: float, extra: float = 1.0) -> float:
        """Seconds per token of `extra` more tokens on a pass of `tokens` (>= 0)."""
        extra = max(float(extra), 1e-6)
        return max(0.0, (self.seconds(tokens + extra) - self.seconds(tokens)) / extra)


def _concave_majorant(pts: list[tuple[float, float]]) -> tuple[list[float], list[float]]:
    """Upper hull of points sorted by x (ties merged by max), slopes clamped at >= 0."""
    hull: list[tuple[float, float]] = []
    for x, y in pts:
        if hull and x == hull[-1][0]:
            if y <= hull[-1][1]:
                continue
            hull.pop()
        while len(hull) >= 2:
            (x1, y1), (x2, y2) = hull[-2], hull[-1]
            # drop the middle point when it lies on or below the chord (not concave)
            if (y2 - y1) * (x - x1) <= (y - y1) * (x2 - x1):
                hull.pop()
            else:
                break
        hull.append((x, y))
    # after the highest point more tokens must not cost less: flatten there
    top = max(range(len(hull)), key=lambda i: hull[i][1]) if hull else 0
    if top < len(hull) - 1:
        hull = hull[: top + 1] + [(hull[-1][0], hull[top][1])]
    return [p[0] for p in hull], [p[1] for p in hull]


__all__ = ["PassCost"]
