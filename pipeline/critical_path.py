"""The critical path of one rollout, counted in target forward passes.

A synchronous RL step lasts as long as its longest responses. On a GPU a decode pass costs
about the same whatever it verifies (it is memory-bound), above all once the batch has
thinned, so what speculation must cut is the number of passes on the step's critical path
and in its tail, not the draft tokens it verifies. This module turns one engine's pass log
of one rollout into those counts. Pure arithmetic, no vLLM (the log is recorded by
`pipeline.rollout.meter`).

A `PassLog`, passes in order (index p from 0):

    tokens[p]          scheduled tokens of pass p
    running[p]         requests scheduled in pass p that emit tokens (not the parts of a
                       prompt that chunked prefill computes before its last)
    new[p]             of them, requests emitting their first token (their prefill)
    outputs_before[p]  output tokens those requests held before pass p (0 for new ones)

and per request r: finish[r] (the pass it finished in), passes[r] (passes it was scheduled
in) and tokens_out[r] (tokens it generated; None when unknown, e.g. an aborted request).

Tokens emitted by pass p, every request together:

    emitted[p] = outputs_before[p+1] - outputs_before[p] + sum(tokens_out[r] for r
                 finishing in p)          (outputs_before[P] = 0 after the last pass)

exact when every request runs in every pass from its first to its last (no preemption,
no deferral by the token budget); the sum over all passes is exact regardless.

`critical_path(log)` gives (`StepPath`):

    passes           passes of the rollout
    critical_passes  passes until the last request finished (its pass index + 1)
    tail_passes      passes after the last one that ran at least tail_frac (25 %) of the
                     rollout's requests: the thinning tail (a prefill split over several
                     passes at the start does not count as tail)
    critical_tau     tau of the critical request, the one that finished last (the longest
                     of those finishing in that pass): (tokens_out - 1) / (passes - 1), its
                     prefill pass emitting its first token
    tail_tau         over the tail passes: (emitted - new) / (running - new), tokens per
                     sequence and decode pass; None without a tail or when a token count
                     is unknown
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from pipeline.costs import tau

TAIL_FRAC = 0.25


@dataclass(frozen=True)
class PassLog:
    """One rollout's passes in order and its requests (see the module docstring)."""

    tokens: Sequence[int]
    running: Sequence[int]
    new: Sequence[int]
    outputs_before: Sequence[int]
    finish: Sequence[int]
    passes: Sequence[int]
    tokens_out: Sequence[int | None]

    def __post_init__(self):
        n = len(self.tokens)
        if not (len(self.running) == len(self.new) == len(self.outputs_before) == n):
            raise ValueError("tokens, running, new and outputs_before need one value per pass")
        if not (len(self.passes) == len(self.tokens_out) == len(self.finish)):
            raise ValueError("finish, passes and tokens_out need one value per request")
        if any(not 0 <= f < n for f in self.finish):
            raise ValueError(f"a finish pass outside 0..{n - 1}")

    def emitted(self) -> list[int] | None:
        """Tokens each pass emitted; None when a request's token count is unknown."""
        if any(t is None for t in self.tokens_out):
            return None
        done = [0] * len(self.tokens)
        for f, t in zip(self.finish, self.tokens_out):
            done[f] += t
        after = [*self.outputs_before[1:], 0]
        return [a - b + d for a, b, d in zip(after, self.outputs_before, done)]


@dataclass(frozen=True)
class StepPath:
    passes: int
    critical_passes: int
    tail_passes: int
    critical_tau: float | None
    tail_tau: float | None


def tail_start(running: Sequence[int], requests: int, tail_frac: float = TAIL_FRAC) -> int:
    """Index of the first tail pass: the pass after the last that ran at least
    tail_frac × requests requests (len(running) when there is no tail)."""
    floor = tail_frac * requests
    last = max((p for p, r in enumerate(running) if r >= floor), default=-1)
    return last + 1


def critical_path(log: PassLog, tail_frac: float = TAIL_FRAC) -> StepPath:
    """Critical and tail passes and their taus (see the module docstring)."""
    n = len(log.tokens)
    if not log.finish:
        return StepPath(n, 0, 0, None, None)
    start = tail_start(log.running, len(log.finish), tail_frac)
    last = max(log.finish)
    ends = [r for r, f in enumerate(log.finish) if f == last]
    known = [r for r in ends if log.tokens_out[r] is not None]
    critical_tau = None
    if known:
        r = max(known, key=lambda i: log.tokens_out[i])
        critical_tau = tau(log.tokens_out[r] - 1, log.passes[r] - 1)
    tail_tau = None
    emitted = log.emitted()
    if start < n and emitted is not None:
        new = sum(log.new[start:])
        tail_tau = tau(sum(emitted[start:]) - new, sum(log.running[start:]) - new)
    return StepPath(passes=n, critical_passes=last + 1, tail_passes=n - start,
                    critical_tau=critical_tau, tail_tau=tail_tau)


def step_record(counts, groups) -> dict:
    """One step's critical path from the engine's pass counts (`PassCounts`) and the
    step's completions, with its passes' running requests and scheduled tokens."""
    log = counts.pass_log({c.request_id: len(c.token_ids) for group in groups for c in group})
    path = critical_path(log)
    return {"requests": len(log.finish), "passes": path.passes,
            "critical_passes": path.critical_passes,
            "tail_passes": path.tail_passes, "critical_tau": path.critical_tau,
            "tail_tau": path.tail_tau, "running": list(log.running), "tokens": list(log.tokens)}


__all__ = ["PassLog", "StepPath", "TAIL_FRAC", "critical_path", "step_record", "tail_start"]
