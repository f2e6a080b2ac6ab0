"""The fewest target passes any one-chain drafter can give a sampled response.

vLLM verifies a drafter's proposal (one token id per position, no draft probabilities:
`ngram`, `suffix` and rhymectl's `custom_class` proposer alike) by rejection sampling
against a one-hot draft: draft token d at a position is accepted with probability p(d)
under the target's distribution there, and on rejection the pass's own token is sampled
from p without d. So a draft token is accepted exactly when the token sampled there
equals it, and the tokens of a response have the target's distribution whatever was
drafted (lossless).

The drafter that maximises each position's acceptance proposes the target's own most
likely token, argmax p, given the context (the drafted tokens before it in the pass
included: they were accepted, so they are the response's). Call it the oracle. For a
response t_1..t_L sampled from the target, let hit_j = (t_j is the argmax at position j).
Under the oracle with at most `cap` draft tokens a pass, the response's passes are then
fixed by its hits alone:

    pass 1 (prefill) emits t_1;
    a decode pass starting at position i accepts the run of hits hit_i, hit_i+1, ...
    (at most `cap` of them, a), then emits one token of its own (the rejected position's
    resample, or the bonus token after a whole draft): it ends at position i + a + 1.

`cap=None` leaves the draft unbounded. A drafter that knows less than the target's own
argmax is accepted less often, position by position, so this count over responses sampled
from the target is the ceiling the measured methods are compared with: the passes of
drafting the target's most likely tokens. (Not a bound for every chain in every case: a
less likely first token may have a surer continuation.)

In a synchronous rollout, whose requests are all prefilled in its first pass, a step
lasts as long as its slowest response: the oracle's critical path is the most passes any
of the step's responses needs.

Pure arithmetic on hit flags; `pipeline.bench.spec_ceiling` computes the flags from a
checkpoint and a bench run's sampled responses (`rhymectl bench spec --ceiling`).
"""

from __future__ import annotations

from typing import Sequence


def oracle_passes(hits: Sequence[bool], cap: int | None) -> int:
    """Target passes of one response of len(hits) tokens under the oracle drafter.

    hits[j]: whether token j (0-based) is the target's most likely token at its position
    (hits[0], the prefill pass's token, is never drafted and is ignored). cap: the most
    draft tokens a pass may verify (0: no speculation, one token a pass; None: unbounded).
    """
    if cap is not None and cap < 0:
        raise ValueError(f"cap must be >= 0 or None, got {cap}")
    n = len(hits)
    if n == 0:
        return 0
    passes, i = 1, 1  # the prefill pass emits token 0
    while i < n:
        accepted = 0
        while (cap is None or accepted < cap) and i + accepted < n and hits[i + accepted]:
            accepted += 1
        passes += 1
        i += accepted + 1
    return passes


def step_ceiling(responses_hits: Sequence[Sequence[bool]], cap: int | None) -> int:
    """The oracle's critical path of one synchronous step: its slowest response's passes."""
    return max((oracle_passes(h, cap) for h in responses_hits), default=0)


def gap_closed(reference: float, method: float, oracle: float) -> float | None:
    """The share of the reference method's gap to the oracle that `method` closes:
    (reference - method) / (reference - oracle), in passes (or any count where lower is
    better). 1: as few as the oracle; 0: no better than the reference; negative: worse;
    above 1: fewer than the oracle (possible: the oracle drafts one chain of the policy's
    argmax, and a draft sampled from a model's probabilities can beat it). None where the
    reference leaves no gap (the oracle no better than it)."""
    gap = reference - oracle
    if gap <= 0:
        return None
    return round((reference - method) / gap, 4)


def gaps_closed(methods: dict[str, tuple[float, float]], oracle: tuple[float, float],
                reference: str = "history+group") -> dict[str, dict[str, float | None]]:
    """Per method (but the reference and `none`), the share of the reference's gap to the
    oracle it closes in total passes and on the median step's critical path. methods:
    name -> (passes, median critical path); oracle: the same pair at the methods' draft
    cap. {} without the reference."""
    if reference not in methods:
        return {}
    ref_passes, ref_path = methods[reference]
    return {name: {"passes": gap_closed(ref_passes, passes, oracle[0]),
                   "critical_passes": gap_closed(ref_path, path, oracle[1])}
            for name, (passes, path) in methods.items() if name not in (reference, "none")}


__all__ = ["gap_closed", "gaps_closed", "oracle_passes", "step_ceiling"]
