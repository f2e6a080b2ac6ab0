"""The `throughput` draft budget (`spec.budget: throughput`): how many draft tokens each
request gets in the next forward pass, by two rules, one per scale:

- **Per request** (RhymeRL's released drafter): a draft-length cap that starts at
  `start_len`, doubles (up to `max_len`) when every drafted token was accepted and halves
  (down to `min_len`) when one was rejected. It follows the request's phase: long copyable
  stretches grow it, divergent ones shrink it.
- **Per pass** (Seer's marginal-benefit rule): verifying draft tokens is not free. With a
  pass costing `base_s + per_token_s * scheduled_tokens`, one more draft token with
  acceptance probability g raises the expected throughput E / T iff g > per_token_s * E / T
  (E: expected tokens emitted, T: pass seconds). Tokens are added greedily by decreasing
  g while that holds. With a full batch E / T is high and only near-certain drafts pass;
  in the long tail, with few sequences, T is almost all `base_s` and drafts up to the cap
  pay off.

The probability that draft token j (1-based) of request i is accepted is estimated as
alpha_i ** j, alpha_i being the request's running per-token acceptance rate: a decayed
count of accepted over tried tokens, shrunk towards the rate of all requests so far
(itself started at `prior_accept`). The budget object lives across RL steps, so requests
of a later step start from what earlier steps measured, even if a full batch kept the
first one from drafting much. Pure logic, no vLLM.

As a `Budget` it sizes drafts before they are made (`ask`), keeps them whole and learns
from each verified draft (`observe`); the pass cost is the fixed `cost` model.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Hashable, Sequence

from pipeline.config.schema import SpecConfig
from pipeline.costs import DRAFT_COST, CostModel
from pipeline.drafting.budget_api import Budget, Remaining
from pipeline.drafting.pass_caps import PassCaps


@dataclass(frozen=True)
class ThroughputConfig:
    """Draft-length rules. Lengths are tokens; `decay` weighs older acceptance evidence."""

    max_len: int = 16
    start_len: int = 2
    min_len: int = 1
    prior_accept: float = 0.5
    prior_weight: float = 2.0  # pseudo-trials behind the prior of a request's rate
    decay: float = 0.9  # per observation, for a request's rate
    global_decay: float = 0.999  # per observation, for the rate of all requests
    # A new request is assumed to be accepted at least this often: without the floor, a
    # stretch of poor drafts (e.g. prompts with no history yet) can drive the shared rate
    # so low that no request is granted a draft again, and no new evidence ever arrives.
    explore_floor: float = 0.3
    batch_aware: bool = True  # False: every request drafts up to its cap
    cost: CostModel = DRAFT_COST  # frozen, so one shared default is safe

    def __post_init__(self):
        if not 1 <= self.min_len <= self.start_len <= self.max_len:
            raise ValueError("need 1 <= min_len <= start_len <= max_len, got "
                             f"{self.min_len}, {self.start_len}, {self.max_len}")


@dataclass
class _State:
    cap: int
    accepted: float = 0.0  # decayed accepted draft tokens
    tried: float = 0.0  # decayed accepted + rejected draft tokens


class ThroughputBudget(Budget):
    """Per-request draft caps and the per-pass allocation."""

    def __init__(self, config: ThroughputConfig = ThroughputConfig()):
        self.config = config
        self._state: dict[Hashable, _State] = {}
        self._all = _State(0)  # every request's evidence, slowly decayed

    @classmethod
    def from_spec(cls, spec: SpecConfig) -> ThroughputBudget:
        """The most tokens a pass may grant (`PassCaps.most`) cap every request's draft;
        caps start below."""
        max_len = PassCaps.from_spec(spec).most
        return cls(ThroughputConfig(max_len=max_len, start_len=min(2, max_len), min_len=1))

    def ask(self, req_ids: Sequence[Hashable], available: Sequence[int], rows: int,
            remaining: Remaining) -> list[int]:
        return self.allocate_ids(req_ids, available, batch_size=rows)

    # -- per request ------------------------------------------------------------------
    def overall_acceptance(self) -> float:
        """Acceptance rate over all requests observed (the prior of a new request)."""
        a, c = self._all, self.config
        rate = (a.accepted + c.prior_accept * c.prior_weight) / (a.tried + c.prior_weight)
        return max(rate, c.explore_floor)

    def observe(self, req_id: Hashable, proposed: int, accepted: int) -> None:
        """Outcome of the request's last verified draft: `accepted` of `proposed` tokens."""
        if proposed <= 0:
            return
        s, c = self._get(req_id), self.config
        accepted = max(0, min(accepted, proposed))
        full = accepted == proposed
        s.cap = min(2 * s.cap, c.max_len) if full else max(s.cap // 2, c.min_len)
        # Tokens after the first rejection were never tested: they are not evidence.
        tried = accepted + (0 if full else 1)
        s.accepted = c.decay * s.accepted + accepted
        s.tried = c.decay * s.tried + tried
        self._all.accepted = c.global_decay * self._all.accepted + accepted
        self._all.tried = c.global_decay * self._all.tried + tried

    def forget(self, req_id: Hashable) -> None:
        self._state.pop(req_id, None)

    def state(self) -> dict:
        """The all-request evidence (a request's own goes when it stops)."""
        return {"accepted": self._all.accepted, "tried": self._all.tried}

    def load_state(self, state: dict) -> None:
        self._all.accepted, self._all.tried = float(state["accepted"]), float(state["tried"])

    def _get(self, req_id: Hashable) -> _State:
        s = self._state.get(req_id)
        if s is None:
            s = self._state[req_id] = _State(self.config.start_len)
        return s

    # -- per pass ---------------------------------------------------------------------
    def allocate_ids(self, req_ids: Sequence[Hashable], available: Sequence[int],
                     batch_size: int | None = None, extra_tokens: int = 0) -> list[int]:
        """Draft tokens per request for the next pass, in order. available: tokens the
        drafter can offer each; batch_size: sequences in the pass (defaults to
        len(req_ids)), each emits at least one token; extra_tokens: other scheduled
        tokens (prefill chunks).

        The marginal-benefit test of a request's first token is the easiest it ever
        faces: E / T only grows as tokens are granted. So only requests whose first token
        passes it at the start enter the heap, and a pass whose best request cannot
        start (a full batch, typically) is settled without touching the others. The
        result is exactly the plain computation's: every request in one max-heap over its
        next token's acceptance probability, popped while the token pays.
        """
        c = self.config
        states = list(map(self._state.get, req_ids))
        start_len = c.start_len
        if not c.batch_aware:
            return [max(0, min(a, start_len if s is None else s.cap))
                    for a, s in zip(available, states)]
        m = len(states)
        alloc = [0] * m
        if not m:
            return alloc
        n = m if batch_size is None else batch_size
        per_token = c.cost.per_token_s
        expected = float(n)
        seconds = c.cost.pass_seconds(n + extra_tokens)
        bar = per_token * expected  # a first token pays iff alpha * seconds > bar
        w = c.prior_weight
        ow = self.overall_acceptance() * w
        fresh = (0.0 + ow) / (0.0 + w)  # acceptance of a request with no evidence yet
        fresh_pays = fresh > 0 and not fresh * seconds <= bar
        # Requests without state can all start or none can: visit them only if they can.
        rows = range(m) if fresh_pays else [i for i, s in enumerate(states) if s is not None]
        heap, limits, alphas = [], {}, {}
        blocked = None  # the non-starter the heap would hold on top of them: (-alpha, i)
        if not fresh_pays and fresh > 0:
            for i, s in enumerate(states):
                if s is None and available[i] > 0:
                    blocked = (-fresh, i)
                    break
        for i in rows:
            s = states[i]
            if s is None:
                a, k = fresh, min(available[i], start_len)
            else:
                a, k = (s.accepted + ow) / (s.tried + w), min(available[i], s.cap)
            if k <= 0 or a <= 0:
                continue
            if a * seconds <= bar:
                if blocked is None or (-a, i) < blocked:
                    blocked = (-a, i)
                continue
            heap.append((-a, i))
            limits[i], alphas[i] = k, a
        if not heap:
            return alloc
        if blocked is not None:
            heap.append(blocked)
        heapq.heapify(heap)
        while heap:
            neg_gain, i = heap[0]
            gain = -neg_gain
            if gain * seconds <= per_token * expected:
                break
            if blocked is not None and i == blocked[1]:
                # Only rounding lets a non-starter pass later. None of them was granted a
                # token, so they join the heap as they would have stood in it from the start.
                for j in range(m):
                    if j in limits:
                        continue
                    s = states[j]
                    if s is None:
                        a, k = fresh, min(available[j], start_len)
                    else:
                        a, k = (s.accepted + ow) / (s.tried + w), min(available[j], s.cap)
                    if k > 0 and a > 0:
                        limits[j], alphas[j] = k, a
                        if j != i:
                            heapq.heappush(heap, (-a, j))
                blocked = None
                continue
            heapq.heappop(heap)
            alloc[i] += 1
            expected += gain
            seconds += per_token
            if alloc[i] < limits[i]:
                heapq.heappush(heap, (-(gain * alphas[i]), i))
        return alloc


__all__ = ["ThroughputBudget", "ThroughputConfig"]
