"""Tail batching (RollPacker), simulated: over-provision a step, train on the first groups
to complete, defer the rest to a later step with fresh generation.

A step that trains on G groups launches ceil(G * (1 + overprovision)) of them. It ends
when G groups have completed (every sibling finished): those are trained on; every other
group is stopped and dropped, never trained on its partial (stale) tokens, and its prompt
goes to the front of the queue of a later step, which generates it again with the policy
of that step, so training stays on-policy. A prompt deferred `max_waits` times is not
deferred again: the step waits for it.

The simulation replays each prompt with its trace lengths every time it runs (a fresh
sample of a prompt is about as long as the last: RhymeRL's observation), so a deferred
long prompt stays long. Per step it reports the step time, the groups trained and
deferred, how many steps the trained prompts waited, and the launched work thrown away.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Callable, Sequence

from pipeline.sched.simulator import SimConfig, SimResult
from pipeline.sched.types import GroupWork, Placement


@dataclass(frozen=True)
class TailBatching:
    overprovision: float = 0.25
    max_waits: int = 2

    def __post_init__(self):
        if self.overprovision < 0:
            raise ValueError(f"overprovision must be >= 0, got {self.overprovision}")
        if self.max_waits < 0:
            raise ValueError(f"max_waits must be >= 0, got {self.max_waits}")


@dataclass
class StepReport:
    """One simulated step. step_s: seconds until its trained groups were complete;
    waits: steps each trained prompt had been deferred; wasted_tokens: tokens of the
    dropped groups' responses that had finished by the end (a lower bound of the work
    thrown away)."""

    step: int
    step_s: float
    launched: int
    trained: int
    deferred: int
    waits: list[int]
    wasted_tokens: int


def step_end(result: SimResult, keep: int, pinned: Sequence[int]) -> tuple[float, list[int]]:
    """(end seconds, kept group indices): the first `keep` groups to complete, and every
    pinned group, whichever completes last."""
    done = [max(f) for f in result.finish_s]
    order = sorted(range(len(done)), key=lambda g: (done[g], g))
    pinned_set = set(pinned)
    free = max(0, keep - len(pinned_set))
    kept = sorted(pinned_set | set([g for g in order if g not in pinned_set][:free]))
    return max(done[g] for g in kept), kept


def simulate_tail(prompts: Sequence[GroupWork], groups_per_step: int, steps: int,
                  policy: Placement, config: SimConfig,
                  sim: Callable[[Placement, Sequence[GroupWork], SimConfig], SimResult],
                  tail: TailBatching | None = None) -> list[StepReport]:
    """`steps` steps over `prompts` (cycled in order) training on `groups_per_step` groups
    each; without `tail`, each step launches exactly those groups and waits for all."""
    fresh = deque(range(len(prompts)))
    deferred: deque[tuple[int, int]] = deque()  # (prompt, times deferred)
    reports = []
    for step in range(steps):
        launch = groups_per_step if tail is None else math.ceil(groups_per_step * (1 + tail.overprovision))
        batch: list[tuple[int, int]] = []
        while deferred and len(batch) < launch:
            batch.append(deferred.popleft())
        while len(batch) < launch:
            if not fresh:
                fresh.extend(range(len(prompts)))
            batch.append((fresh.popleft(), 0))
        groups = [prompts[p] for p, _ in batch]
        result = sim(policy, groups, config, step)
        if tail is None:
            kept = list(range(len(batch)))
            end = result.makespan_s
        else:
            pinned = [i for i, (_, waits) in enumerate(batch) if waits >= tail.max_waits]
            end, kept = step_end(result, groups_per_step, pinned)
        kept_set = set(kept)
        dropped = [i for i in range(len(batch)) if i not in kept_set]
        for i in dropped:
            deferred.append((batch[i][0], batch[i][1] + 1))
        wasted = sum(length for i in dropped
                     for length, f in zip(groups[i].lengths, result.finish_s[i]) if f <= end)
        reports.append(StepReport(step, end, len(batch), len(kept), len(dropped),
                                  [batch[i][1] for i in kept], wasted))
    return reports


__all__ = ["StepReport", "TailBatching", "simulate_tail", "step_end"]
