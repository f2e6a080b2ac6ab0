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
- `SCHED_COST` (18 ms + 0.2 ms per token, issue 5): the scheduler's and the simulator's
  default, measured on full-batch passes.

`rhymectl bench spec` and `bench sched` fit the model to the passes they measure (`fit`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
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

    def pass_s(self, batch: int) -> float:
        """Seconds of one decode pass over `batch` running requests."""
        per_request = 1 + self.draft_tokens if self.speculating(batch) else 1
        return self.pass_seconds(batch * per_request)

    def tokens_per_pass(self, batch: int) -> float:
        return self.tau if self.speculating(batch) else 1.0

    def rate(self, batch: int) -> float:
        """Tokens per second gained by each of `batch` running requests."""
        return self.tokens_per_pass(batch) / self.pass_s(batch)


DRAFT_COST = CostModel(base_s=0.0085, per_token_s=0.000062)
SCHED_COST = CostModel(base_s=0.018, per_token_s=0.0002)


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


__all__ = ["CostModel", "DRAFT_COST", "SCHED_COST", "accept_rate", "bubble_ratio", "fit",
           "tail_s", "tau"]
