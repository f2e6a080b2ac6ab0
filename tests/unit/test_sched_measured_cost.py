"""The pass-cost model training's placement refits from each step's measured passes."""

from __future__ import annotations

import pytest

from pipeline.costs import SCHED_COST, CostModel
from pipeline.loop.sched_runtime import WorkerTimes, measured_cost
from pipeline.rollout.meter import PassCounts


def worker(samples, *, seq_passes=0, prefill_seq_passes=0, draft_tokens=0, generated=0,
           requests=0) -> WorkerTimes:
    return WorkerTimes(passes=PassCounts(samples=list(samples), seq_passes=seq_passes,
                                         prefill_seq_passes=prefill_seq_passes,
                                         draft_tokens=draft_tokens),
                       generated=generated, requests=requests)


def exact(tokens, base=0.002, per_token=0.00005, prefill=False):
    return [(t, base + per_token * t, prefill) for t in tokens]


def test_fits_base_and_per_token_over_every_workers_decode_passes():
    # prefill passes (much slower here) are left out; two workers' passes fit together
    a = worker(exact([10, 40]) + [(200, 1.0, True)])
    b = worker(exact([80, 160]))
    cost = measured_cost([a, b], SCHED_COST)
    assert cost.base_s == pytest.approx(0.002) and cost.per_token_s == pytest.approx(0.00005)
    assert cost.tau == 1.0 and cost.draft_tokens == 0


def test_with_speculation_tau_and_drafts_per_request_and_pass():
    # 100 decode (request, pass) pairs after 10 prefills emitted 310 - 10 tokens, drafting 400
    w = worker(exact([50, 90, 130]), seq_passes=110, prefill_seq_passes=10, draft_tokens=400,
               generated=310, requests=10)
    cost = measured_cost([w], SCHED_COST)
    assert cost.tau == pytest.approx(3.0) and cost.draft_tokens == 4
    assert cost.base_s == pytest.approx(0.002)


def test_what_the_passes_cannot_determine_comes_from_the_fallback():
    prior = CostModel(base_s=0.01, per_token_s=0.001, tau=2.0, draft_tokens=3)
    one_size = worker(exact([64, 64, 64]))  # one token count: no slope
    cost = measured_cost([one_size], prior)
    assert (cost.base_s, cost.per_token_s) == (0.01, 0.001)
    assert cost.tau == 1.0  # nothing was drafted in these passes: no speculation
    assert measured_cost([WorkerTimes()], prior).base_s == 0.01  # a worker that ran no passes
    noisy = worker([(10, 0.005, False), (100, 0.004, False)])  # slower with fewer tokens
    assert measured_cost([noisy], prior).per_token_s == 0.001
