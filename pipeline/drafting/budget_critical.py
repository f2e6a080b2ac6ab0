"""The `critical` draft budget (`spec.budget: critical`): how many draft tokens each request
gets in the next pass.

Goal. A synchronous RL step ends when its last request ends. Minimise the expected time
to finish the step's requests, not one pass's throughput.

Derivation. Let c(x) be the seconds of a pass with x scheduled tokens (`pipeline.costs.PassCost`,
refitted online) and m = c'(x) the marginal seconds of one more token in this pass. Request i has
R_i predicted remaining tokens (history + finished siblings, `pipeline.drafting.remaining`)
and emits tau_i tokens per pass, so it needs r_i = R_i / tau_i more passes.

- Verifying draft token j of request i costs m now.
- If accepted (probability g_ij, the calibrated product of the tree's per-token path
  probabilities, `pipeline.drafting.calibration`), it (a) is a token the request would
  otherwise compute in a later pass: m refunded; (b) shortens request i by 1 / tau_i
  passes. That shortens the step only if i is the request that ends last. Its
  probability pi_i: with remaining passes r_i + noise, the noise Gumbel with scale beta
  (the mean spread of the predictions, in passes), P(i ends last) = softmax(r_i / beta)
  exactly. The pass saved is a tail pass, which costs c_tail = c(1 + max_len).
- So token j pays iff   g_ij * (m + v_i) > m,   v_i = pi_i * c_tail / tau_i,
  i.e. g_ij > m / (m + v_i). Since g_ij falls with j, request i gets the longest prefix
  of its draft above its threshold.

Consequences, the properties the tests check:
- **Long requests first.** A request with more remaining passes has a larger pi_i, a
  lower threshold, and drafts longer; one far from the critical path drafts only tokens
  it is nearly sure of.
- **Full batches draft only where it pays.** Many requests share pi (it sums to 1) and
  on a compute-bound curve m is a large share of a pass.
- **The thinning tail drafts to the cap.** Few requests: pi_i ~ 1, v_i >> m.
- **Flat vs concave cost.** On a flat (GPU-like) curve m ~ 0 and every draft token with
  g > 0 pays; on a concave one m is taken as the average marginal over the tokens the
  pass would get (c(x + K) - c(x)) / K, refined once after the first allocation.
- With no measured pass yet, the cost is unknown and the budget drafts to the cap.

The pass cost. `spec.pass_cost: fixed` (the default) prices passes with one line that no
measurement moves (`fixed_pass_cost`: `pipeline.costs.DRAFT_COST`), so drafts follow the
run's recorded state alone and a seeded rerun is the same run; `online` refits c(x) from
the engine's pass meter (`observe_pass`), which follows the machine's load.

The budget uses both stages of the `Budget` protocol to keep the drafter's cost where it
pays: `ask` picks the requests whose first token could pay at the best calibrated rate
(the others are not drafted at all) and `grant` trims the drafts to their paying prefix
by the calibrated acceptance of the tree's per-token path probabilities. It learns the
pass cost from the engine's measured passes (`observe_pass`) and the calibration from
every verified draft (`observe`). Pure logic, no vLLM. Units: tokens, passes, seconds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Hashable, Sequence

import numpy as np

from pipeline.config.schema import SpecConfig
from pipeline.costs import DRAFT_COST, CostModel, PassCost
from pipeline.drafting.budget_api import Budget, Remaining
from pipeline.drafting.calibration import Calibrator, conditional, restore_state
from pipeline.drafting.pass_caps import PassCaps
from pipeline.drafting.suffix_tree import Draft


@dataclass(frozen=True)
class CriticalConfig:
    """max_len: most draft tokens per request and pass; first_prior: the first draft
    token's acceptance assumed before any was verified (stage 1); tau_decay: weight of a request's
    older passes in its tokens-per-pass estimate; min_spread: floor of the prediction
    spread beta, in passes (below it ranks are treated as certain)."""

    max_len: int = 32
    first_prior: float = 0.5  # first-token acceptance assumed before any evidence
    tau_prior: float = 1.0
    tau_decay: float = 0.7
    min_spread: float = 1.0

    def __post_init__(self):
        if self.max_len < 1 or self.tau_prior < 1 or not 0 <= self.tau_decay < 1:
            raise ValueError(f"need max_len >= 1, tau_prior >= 1, 0 <= tau_decay < 1; got "
                             f"{self.max_len}, {self.tau_prior}, {self.tau_decay}")


def fixed_pass_cost(model: CostModel = DRAFT_COST) -> PassCost:
    """A pass-cost curve that no measurement moves (`spec.pass_cost: fixed`): `model`'s
    line, through passes of 1 and 4,096 tokens. Only its shape decides drafts (the
    marginal token against a tail pass), so a line measured on one machine serves as
    a deterministic stand-in for any other's curve."""
    cost = PassCost()
    for tokens in (1, 4096):
        cost.observe(tokens, model.pass_seconds(tokens))
    cost.refit()
    return cost


def critical_weights(passes: Sequence[float], spreads: Sequence[float],
                     min_spread: float = 1.0) -> np.ndarray:
    """P(request i ends last): softmax(r_i / beta), beta the Gumbel scale of the mean
    spread (std = beta * pi / sqrt 6) of the predictions, in passes."""
    r = np.asarray(passes, dtype=float)
    if not len(r):
        return r
    std = max(float(np.mean(spreads)), min_spread)
    beta = std * math.sqrt(6.0) / math.pi
    z = (r - r.max()) / beta
    e = np.exp(z)
    return e / e.sum()


def paying_prefix(cum_accept: Sequence[float], threshold: float) -> int:
    """Tokens of a draft whose cumulative acceptance exceeds `threshold` (a prefix)."""
    k = 0
    for g in cum_accept:
        if g <= threshold:
            break
        k += 1
    return k


class CriticalBudget(Budget):
    """Per-pass allocation by the critical-path rule (see the module docstring)."""

    def __init__(self, config: CriticalConfig = CriticalConfig(), cost: PassCost | None = None,
                 calibrator: Calibrator | None = None, learn_cost: bool = True):
        """learn_cost: refit `cost` from the engine's measured passes (`observe_pass`)."""
        self.config = config
        self.cost = cost or PassCost()
        self.learn_cost = learn_cost
        self.calibrator = calibrator or Calibrator()
        self._tau: dict[Hashable, float] = {}
        self._tau_all = config.tau_prior + 1.0  # prior: one accepted draft token per pass
        # first-token acceptance per request (EMA) and over all requests: stage 1's
        # estimate of whether a request's draft can pay before drafting it
        self._first: dict[Hashable, float] = {}
        self._first_all = config.first_prior
        self._values: list[float] = []  # v_i of the last `ask`, per candidate
        self._rows = 0
        self._asked: Sequence[Hashable] = ()  # the candidates of the last `ask`
        # per request, the tree's per-token probabilities of its kept draft, until verified
        self._kept: dict[Hashable, list[float]] = {}

    @classmethod
    def from_spec(cls, spec: SpecConfig) -> CriticalBudget:
        cost = fixed_pass_cost() if spec.pass_cost == "fixed" else None
        return cls(CriticalConfig(max_len=PassCaps.from_spec(spec).most), cost=cost,
                   learn_cost=cost is None)

    # -- evidence ---------------------------------------------------------------------
    def observe_pass(self, tokens: int, seconds: float) -> None:
        """One decode pass measured by the engine's pass meter (ignored with a fixed
        cost: measured seconds never decide a draft then)."""
        if self.learn_cost:
            self.cost.observe(tokens, seconds)

    def observe(self, req_id: Hashable, proposed: int, accepted: int) -> None:
        qs = self._kept.pop(req_id, None)
        if qs is not None:
            self.observe_draft(req_id, qs, accepted)

    def observe_draft(self, req_id: Hashable, qs: Sequence[float], accepted: int) -> None:
        """Request `req_id`'s last draft (per-token tree probabilities `qs`) had its first
        `accepted` tokens accepted."""
        if not qs:
            return
        self.calibrator.observe(qs, accepted)
        d = self.config.tau_decay
        emitted = 1.0 + max(0, min(accepted, len(qs)))
        self._tau[req_id] = d * self._tau.get(req_id, self._tau_all) + (1 - d) * emitted
        self._tau_all = 0.99 * self._tau_all + 0.01 * emitted
        hit = 1.0 if accepted > 0 else 0.0
        self._first[req_id] = d * self._first.get(req_id, self._first_all) + (1 - d) * hit
        self._first_all = 0.99 * self._first_all + 0.01 * hit

    def forget(self, req_id: Hashable) -> None:
        self._tau.pop(req_id, None)
        self._first.pop(req_id, None)
        self._kept.pop(req_id, None)

    def calibration(self) -> dict:
        """The calibration counts (`Calibrator.state()`)."""
        return self.calibrator.state()

    def state(self) -> dict:
        """The calibration counts, the all-request rates and, when learnt, the cost fit."""
        out = {"calibration": self.calibrator.state(), "tau_all": self._tau_all,
               "first_all": self._first_all}
        if self.learn_cost:
            out["cost"] = self.cost.state()
        return out

    def load_state(self, state: dict) -> None:
        restore_state(self.calibrator, state["calibration"])
        self._tau_all, self._first_all = float(state["tau_all"]), float(state["first_all"])
        if self.learn_cost and "cost" in state:
            self.cost.load_state(state["cost"])

    # -- the rule ---------------------------------------------------------------------
    def values(self, req_ids: Sequence[Hashable], remaining: Sequence[tuple[float, float]]
               ) -> np.ndarray:
        """v_i: seconds saved per accepted draft token of each request (critical path)."""
        n = len(req_ids)
        if not n:
            return np.zeros(0)
        get, prior = self._tau.get, self._tau_all
        taus = np.fromiter((get(r, prior) for r in req_ids), float, n)
        rem = np.asarray(remaining, dtype=float).reshape(n, 2).clip(min=0.0)
        pi = critical_weights(rem[:, 0] / taus, rem[:, 1] / taus, self.config.min_spread)
        return pi * (self.cost.seconds(1 + self.config.max_len) / taus)

    def ask(self, req_ids: Sequence[Hashable], available: Sequence[int], rows: int,
            remaining: Remaining) -> list[int]:
        """Stage 1: tokens to ask the drafter for, per candidate (0: do not draft).

        remaining(req_ids): (mean, std) predicted remaining tokens per candidate, asked
        at every pass (its estimates are cached from the pass they were made in on);
        rows: sequences in the pass (each schedules one token besides its drafts).
        """
        predicted = remaining(req_ids)
        self._asked = req_ids
        cap = self.config.max_len
        limits = [a if a < cap else cap for a in available]
        self._rows = rows
        if not self.cost.known:
            self._values = [math.inf] * len(req_ids)
            return [max(k, 0) for k in limits]
        self._values = v = self.values(req_ids, predicted).tolist()
        m = self.cost.marginal(rows)
        # a first token pays iff a * (m + v) > m, a its acceptance estimate: the request's
        # own first-token rate (measured: the best calibrated bucket alone lets almost
        # every request of a full batch through, and drafting them all costs more than
        # the pass), never above the best calibrated bucket
        best = self.calibrator.best()
        get, prior = self._first.get, self._first_all
        out = []
        for r, k, vi in zip(req_ids, limits, v):
            a = min(get(r, prior), best)
            out.append(k if k > 0 and a * (m + vi) > m else 0)
        return out

    def grant(self, drafts: Sequence[Draft]) -> list[int]:
        """Stage 2: each draft's paying prefix, by the calibrated per-token acceptance of
        the tree's path probabilities; the kept part's probabilities are held until the
        draft is verified (`observe`)."""
        qs = [conditional(d.probs) if d.token_ids else [] for d in drafts]
        kept = self.trim([self.calibrator.cumulative(q) if q else () for q in qs])
        held = self._kept
        for r, q, k in zip(self._asked, qs, kept):
            if k:
                held[r] = q[:k]
        return kept

    def trim(self, cum_accept: Sequence[Sequence[float]]) -> list[int]:
        """Draft tokens granted per candidate of the last `ask`, given each draft's
        cumulative calibrated acceptance (empty for candidates not drafted)."""
        v = self._values
        if not self.cost.known:
            return [len(g) for g in cum_accept]
        if not any(cum_accept):
            return [0] * len(cum_accept)
        rows = self._rows
        m = self.cost.marginal(rows)
        alloc = [0] * len(cum_accept)
        for _ in range(2):  # concave cost: refine m as the average over the granted tokens
            alloc = [paying_prefix(g, m / (m + vi)) if g else 0 for g, vi in zip(cum_accept, v)]
            total = sum(alloc)
            if not total:
                break
            m2 = self.cost.marginal(rows, total)
            if m2 >= m * 0.999:
                break
            m = m2
        return alloc


__all__ = ["CriticalBudget", "CriticalConfig", "critical_weights", "fixed_pass_cost",
           "paying_prefix"]
