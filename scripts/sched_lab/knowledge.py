"""What a placement policy is told about a step's lengths, from what training has to more.

The policies place requests by each group's `predicted` length. Training has the history
predictor's per-prompt guess. Replacing it with facts of the step itself shows what better
predictions could buy at most, and so whether a missed scheduling target is a policy's
fault or a lack of information:

- `history`: the history predictor's per-prompt prediction (what training has);
- `group-mean`, `group-max`: the mean / the longest of the group's true lengths in this
  step. No per-prompt predictor can know more than the group's realised lengths: these
  bound what perfect per-prompt prediction would buy;
- `response`: every response its own group, predicted at its true length. Known only
  after generating it; this is what the oracle policy knows.

Only the simulator can run these (it has the true lengths); `scripts/sched_knowledge.py`
runs the policies on each.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Sequence

from pipeline.sched.types import GroupWork

LEVELS = ("history", "group-mean", "group-max", "response")


def with_knowledge(groups: Sequence[GroupWork], level: str) -> list[GroupWork]:
    """`groups` with predictions at knowledge `level` (one of LEVELS); every group must
    carry its true lengths except at `history`."""
    if level not in LEVELS:
        raise ValueError(f"knowledge level {level!r}: choose from {', '.join(LEVELS)}")
    if level == "history":
        return list(groups)
    missing = [g.prompt_id for g in groups if g.lengths is None]
    if missing:
        raise ValueError(f"knowledge level {level!r} needs the true lengths; group "
                         f"{missing[0]!r} has none")
    if level == "response":
        return [GroupWork(f"{g.prompt_id}/{s}", 1, float(length), True, (length,))
                for g in groups for s, length in enumerate(g.lengths)]
    of = max if level == "group-max" else (lambda xs: sum(xs) / len(xs))
    return [replace(g, predicted=float(of(g.lengths)), known=True) for g in groups]


__all__ = ["LEVELS", "with_knowledge"]
