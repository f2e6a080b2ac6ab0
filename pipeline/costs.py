"""What a target forward pass costs, and the arithmetic every rollout metric shares.

One pass-cost model serves the draft budget, the scheduler, the simulator and the benches:
a forward pass that schedules t tokens costs `base_s + per_token_s * t` seconds. With
speculation (tau > 1) each of b running requests emits tau tokens per pass on average and
schedules 1 + draft_tokens tokens, at batch sizes up to spec_max_batch only (None: at
every size).

Two measured defaults, on this project's 2-core CPU machine with the tiny policy:

- `DRAFT_COST` (8.5 ms + 0.062 ms per token): a least-squares fit over every decode pass
  of a history+group rollout, 5 to 900 scheduled tokens. The cost is concave there (about
  0.1 ms per token below 128 tokens, 0.05 ms above 300), so a fit over small passes alone
  would price verification too high. The draft budget's default.
- `SCHED_COST` (18 ms + 0.2 ms per token, a 2-core CPU): the scheduler's and the simulator's
  default, measured on full-batch passes.

`rhymectl bench spec` and `bench sched` fit the model to the passes they measure (`fit`).

`Roofline` is a different thing: a pass on an accelerator that was not measured, from its
published peak figures (`H100_7B`), used to estimate what a rollout's passes would cost
there (`rhymectl bench spec`'s GPU estimate).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from statistics import median
from typing import Sequence


@dataclass(frozen=True)
class CostModel:
    """Seconds per target forward pass as a function of scheduled tokens or batch size."""

    base_s: float
    per_token_s: float
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

    def pass_seconds(self, scheduled_tokens: float) -> float:
        """Seconds of one pass that schedules `scheduled_tokens` tokens."""
        return self.base_s + self.per_token_s * scheduled_tokens

    def speculating(self, batch: int) -> bool:
        return self.tau > 1 and (self.spec_max_batch is None or batch <= self.spec_max_batch)

    def scheduled_per_request(self, batch: int) -> int:
        """Tokens one of `batch` running requests schedules per decode pass: its own plus
        its drafts while speculating."""
        return 1 + self.draft_tokens if self.speculating(batch) else 1

    def pass_s(self, batch: int) -> float:
        """Seconds of one decode pass over `batch` running requests."""
        return self.pass_seconds(batch * self.scheduled_per_request(batch))

    def tokens_per_pass(self, batch: int) -> float:
        return self.tau if self.speculating(batch) else 1.0

    def rate(self, batch: int) -> float:
        """Tokens per second gained by each of `batch` running requests."""
        return self.tokens_per_pass(batch) / self.pass_s(batch)


DRAFT_COST = CostModel(base_s=0.0085, per_token_s=0.000062)
SCHED_COST = CostModel(base_s=0.018, per_token_s=0.0002)


@dataclass(frozen=True)
class Roofline:
    """A target forward pass of a dense model on one accelerator, at peak: the weights are
    read from memory once per pass, and every scheduled token costs its matmul FLOPs; the
    pass takes the longer of the two,

        seconds(t) = max(weight_bytes / mem_bytes_per_s, t * flops_per_token / peak_flops)

    memory-bound (flat in t) below `ridge_tokens`, compute-bound above. Not modelled: KV-cache
    reads (they grow with context and batch), attention FLOPs, kernel launches and the
    host's scheduling, sampling and drafting between passes. A lower bound on a real pass.
    Units: bytes, FLOPs, seconds, tokens."""

    name: str
    weight_bytes: float
    flops_per_token: float
    mem_bytes_per_s: float
    peak_flops: float

    def __post_init__(self):
        if min(self.weight_bytes, self.flops_per_token, self.mem_bytes_per_s,
               self.peak_flops) <= 0:
            raise ValueError(f"roofline constants must be > 0, got {self}")

    @property
    def weights_s(self) -> float:
        """Seconds to read the weights once: the memory-bound pass."""
        return self.weight_bytes / self.mem_bytes_per_s

    @property
    def ridge_tokens(self) -> float:
        """Scheduled tokens above which a pass is compute-bound."""
        return self.weights_s * self.peak_flops / self.flops_per_token

    def pass_seconds(self, scheduled_tokens: float) -> float:
        return max(self.weights_s, scheduled_tokens * self.flops_per_token / self.peak_flops)

    def estimate_s(self, tokens_per_pass: Sequence[float]) -> float:
        """Seconds of passes that scheduled these tokens, one after the other."""
        return sum(self.pass_seconds(t) for t in tokens_per_pass)

    def as_dict(self) -> dict:
        return {"name": self.name, "weight_bytes": self.weight_bytes,
                "flops_per_token": self.flops_per_token,
                "mem_bytes_per_s": self.mem_bytes_per_s, "peak_flops": self.peak_flops,
                "weights_ms": round(self.weights_s * 1e3, 3),
                "ridge_tokens": round(self.ridge_tokens, 1)}


# A 7B dense policy (Qwen2.5-7B: 7.6e9 parameters, bf16) on one H100 SXM. NVIDIA's H100
# datasheet: HBM3 3.35 TB/s; BF16 Tensor Core 1,979 TFLOPS with sparsity, 989 dense. Weights
# 2 bytes x 7.6e9 = 15.2 GB; 2 FLOPs per parameter and token. Sources in docs/speculation.md.
H100_7B = Roofline("H100 SXM, 7B dense bf16, roofline at peak", weight_bytes=15.2e9,
                   flops_per_token=2 * 7.6e9, mem_bytes_per_s=3.35e12, peak_flops=989e12)


def fit(samples: Sequence[tuple[float, float]], fallback: CostModel) -> CostModel:
    """Least-squares base and per-token cost from (scheduled_tokens, seconds) pairs.

    Returns `fallback` when the samples cannot determine both terms (fewer than two
    distinct token counts) or the fit is not positive.
    """
    xs = [float(x) for x, _ in samples]
    ys = [float(y) for _, y in samples]
    n = len(xs)
    if n < 2 or len(set(xs)) < 2:
        return fallback
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    base = my - slope * mx
    if slope <= 0 or base <= 0:
        return fallback
    return CostModel(base_s=base, per_token_s=slope)


def tau(emitted: float, seq_passes: float) -> float:
    """Tokens per target forward pass and sequence (bonus token included); 1 without passes.

    emitted: tokens produced by decode passes; seq_passes: sum over passes of the sequences
    each pass decoded.
    """
    return emitted / seq_passes if seq_passes > 0 else 1.0


def accept_rate(emitted: float, seq_passes: float, draft_tokens: float) -> float:
    """Accepted draft tokens / draft tokens verified: every pass emits one token of its own
    per sequence (the bonus or the correction), the rest were accepted drafts."""
    return max(0.0, emitted - seq_passes) / draft_tokens if draft_tokens else 0.0


def bubble_ratio(busy_s: Sequence[float], span_s: float) -> float:
    """Idle worker-seconds / worker-seconds over a span in which each worker was busy
    busy_s[w] seconds; 0 for an empty span."""
    total = len(busy_s) * span_s
    return max(0.0, (total - sum(busy_s)) / total) if total > 0 else 0.0


def tail_s(finish: Sequence[float]) -> float:
    """Time from the moment 90 % of the requests (rounded up) had finished to the last."""
    done = sorted(finish)
    return done[-1] - done[math.ceil(0.9 * len(done)) - 1]


# -- the online model -------------------------------------------------------------------
MAX_BINS = 24  # log2 bins: 1 .. 2**23 tokens


class PassCost:
    """Seconds of one forward pass as a concave, non-decreasing function of its tokens,
    refitted online (the critical draft budget's model).

    An online model of one target forward pass's cost: seconds as a function of the
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

    def state(self) -> dict:
        """The samples, the count since the last refit and the curve (JSON-friendly)."""
        return {"bins": {str(b): [list(xs), list(ts)] for b, (xs, ts) in self._bins.items()},
                "pending": self._pending, "xs": list(self._xs), "ys": list(self._ys)}

    def load_state(self, state: dict) -> None:
        """Continue from `state()`: the same samples and the same curve."""
        self._bins = {int(b): (deque(map(float, xs), maxlen=self.window),
                               deque(map(float, ts), maxlen=self.window))
                      for b, (xs, ts) in state["bins"].items()}
        self._pending = int(state["pending"])
        self._xs, self._ys = list(map(float, state["xs"])), list(map(float, state["ys"]))

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


__all__ = ["CostModel", "DRAFT_COST", "H100_7B", "PassCost", "Roofline", "SCHED_COST",
           "accept_rate", "bubble_ratio", "fit", "tail_s", "tau"]
