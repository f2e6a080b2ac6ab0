"""Per request and pass: a tree draft, a model draft, or nothing (the rule
`pipeline.drafting.model_source.ModelSource.choose` applies in every pass of
`spec.method: history+group+model`).

The trees draft what earlier responses and siblings wrote; the draft model
(`pipeline.drafting.draft_model`) drafts what the policy would compute. A pass may verify
either for each request, and the model's own forward costs time whenever any row uses it.
The rule prices both drafts as the critical-path budget prices tokens
(`pipeline.drafting.budget_critical`, docs/speculation.md):

- a verified draft token costs m seconds (the pass's marginal token);
- an accepted one gives back m and shortens its request by 1 / tau_i passes, which ends
  the step sooner only if the request ends last: v_i = pi_i * c_tail / tau_i, with
  pi_i = P(i ends last) = softmax(r_i / beta) over the requests' predicted remaining
  passes r_i (`critical_weights`) and c_tail the seconds of a tail pass;
- so a draft's first n tokens are worth (m + v_i) * E_n - n * m, E_n its expected accepted
  tokens (the sum of the prefix products of the per-token acceptance estimates), and a
  model draft also costs `model_row_s` for its row.

Each request takes the source and prefix with the largest value, nothing when none is
positive: expected accepted tokens, weighted toward the requests that end the step, per
unit of the pass cost they add. If the rows that chose the model gain less over their
best tree-or-nothing choice than the model's fixed cost of a pass (`model_pass_s`), the
model is not run that pass and they fall back.

Acceptance estimates: for a tree draft, the calibrated conditional rates of its path
probabilities (what `CriticalBudget.grant` uses); for a model draft, the model's own
probability of its argmax at each step, which matches the one-hot acceptance p_target(d)
of a greedy draft where the model matches the policy, and is a lower estimate for a
sampled draft verified with its probabilities (`spec.draft_probs`: accepted with
sum min(p, q)); each source's estimates are calibrated against its accepted tokens in the
rollout (`ModelSource`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Hashable, Sequence

from pipeline.costs import CostModel
from pipeline.drafting.budget_critical import critical_weights

TREE, MODEL, NOTHING = "tree", "model", "none"


@dataclass(frozen=True)
class SourceDraft:
    """One source's draft for a request: tokens, and each token's acceptance estimate
    given that the tokens before it were accepted."""

    tokens: tuple[int, ...]
    accept: tuple[float, ...]

    def __post_init__(self):
        if len(self.tokens) != len(self.accept):
            raise ValueError(f"{len(self.tokens)} tokens but {len(self.accept)} acceptance "
                             "estimates")


@dataclass(frozen=True)
class Options:
    """What a request can draft this pass. remaining: (mean, std) predicted remaining
    output tokens; tau: its tokens per pass so far."""

    req_id: Hashable
    tree: SourceDraft | None
    model: SourceDraft | None
    remaining: tuple[float, float]
    tau: float = 1.0


@dataclass(frozen=True)
class Choice:
    req_id: Hashable
    source: str  # TREE, MODEL or NOTHING
    tokens: tuple[int, ...]
    expected: float  # expected accepted tokens of the kept prefix
    value_s: float  # seconds the rule expects it to save (0 for nothing)


@dataclass(frozen=True)
class ChoiceCosts:
    """pass_cost: the target pass's seconds by scheduled tokens; model_pass_s /
    model_row_s: the draft model's seconds per pass that runs it and per row it drafts;
    max_len: the longest draft (the tail pass is priced at 1 + max_len tokens);
    min_spread: floor of the remaining-pass predictions' spread."""

    pass_cost: CostModel
    model_pass_s: float = 0.0
    model_row_s: float = 0.0
    max_len: int = 8
    min_spread: float = 1.0


def tree_draft(tokens: Sequence[int], path_probs: Sequence[float]) -> SourceDraft | None:
    """The tree's granted draft as per-token acceptance estimates (the ratios of its path
    probabilities: each token's given that the tokens before it were accepted)."""
    if not tokens:
        return None
    accept, before = [], 1.0
    for p in path_probs[:len(tokens)]:
        accept.append(min(1.0, float(p) / before) if before > 0 else 0.0)
        before = float(p)
    return SourceDraft(tuple(tokens), tuple(accept))


def best_prefix(draft: SourceDraft | None, weight: float, m: float,
                extra: float = 0.0) -> tuple[int, float, float]:
    """(tokens kept, expected accepted, value in seconds) of the draft's most valuable
    prefix: (weight) * E_n - n * m - extra, or (0, 0, 0) when no prefix is worth it."""
    best = (0, 0.0, 0.0)
    if draft is None:
        return best
    run, expected = 1.0, 0.0
    for n, a in enumerate(draft.accept, start=1):
        run *= float(a)
        expected += run
        value = weight * expected - n * m - extra
        if value > best[2]:
            best = (n, expected, value)
    return best


def token_values(remaining: Sequence[tuple[float, float]], taus: Sequence[float],
                 costs: ChoiceCosts) -> list[float]:
    """Seconds an accepted draft token of each request is worth: m + pi_i * c_tail / tau_i
    (the module docstring), from each one's (mean, std) predicted remaining tokens and its
    tokens per pass so far."""
    taus = [max(float(t), 1.0) for t in taus]
    passes = [max(r[0], 0.0) / t for r, t in zip(remaining, taus)]
    spreads = [max(r[1], 0.0) / t for r, t in zip(remaining, taus)]
    pi = critical_weights(passes, spreads, costs.min_spread)
    m = costs.pass_cost.per_token_s
    tail = costs.pass_cost.pass_seconds(1 + costs.max_len)
    return [m + float(p) * tail / t for p, t in zip(pi, taus)]


def worth_a_step(reach: Sequence[float], values: Sequence[float], m: float,
                 step_s: float) -> bool:
    """Whether one more forward step of the draft model pays: it drafts one more token
    for each row, row i's at most reach[i] likely to be accepted (the probability that
    its draft so far is accepted whole), worth values[i] seconds if accepted and costing
    m to verify; the step costs step_s. The bound never stops a step that could pay."""
    gain = sum(max(0.0, v * float(r) - m) for r, v in zip(reach, values))
    return gain > step_s


def choose(options: Sequence[Options], costs: ChoiceCosts) -> list[Choice]:
    """The choice for each running request of a pass, in the order of `options`."""
    if not options:
        return []
    m = costs.pass_cost.per_token_s
    values = token_values([o.remaining for o in options], [o.tau for o in options], costs)
    picks, fallbacks = [], []
    for o, weight in zip(options, values):
        tree = best_prefix(o.tree, weight, m)
        model = best_prefix(o.model, weight, m, costs.model_row_s)
        fallback = (TREE, tree) if tree[0] else (NOTHING, (0, 0.0, 0.0))
        picks.append((MODEL, model) if model[2] > fallback[1][2] else fallback)
        fallbacks.append(fallback)
    gain = sum(pick[1][2] - fb[1][2] for pick, fb in zip(picks, fallbacks) if pick[0] == MODEL)
    if gain and gain <= costs.model_pass_s:
        picks = fallbacks  # the model's pass costs more than its rows gain over the trees
    out = []
    for o, (source, (n, expected, value)) in zip(options, picks):
        draft = o.tree if source == TREE else o.model if source == MODEL else None
        out.append(Choice(o.req_id, source, tuple(draft.tokens[:n]) if draft else (),
                          expected, value))
    return out


__all__ = ["MODEL", "NOTHING", "TREE", "Choice", "ChoiceCosts", "Options", "SourceDraft",
           "best_prefix", "choose", "token_values", "tree_draft", "worth_a_step"]
