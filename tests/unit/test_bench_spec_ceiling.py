"""`bench spec --ceiling` (`pipeline.bench.spec_ceiling`) on a small random transformers
model: responses that follow the model's argmax are drafted whole by the oracle, cap 0
counts one pass a token, and the per-step critical path is the slowest response's."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from pipeline.bench.spec import EpochWork, StepWork
from pipeline.bench.spec_ceiling import CAPS, argmax_hits, oracle_ceiling

N = 2  # responses per prompt


@pytest.fixture(scope="module")
def policy_dir(random_llama_dir):
    return random_llama_dir


def greedy(model, prompt, n):
    out = []
    for _ in range(n):
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([prompt + out])).logits[0, -1]
        out.append(int(logits.argmax()))
    return out


def test_the_oracle_drafts_argmax_responses_whole(policy_dir):
    from pipeline.bench.spec_ceiling import load_policy
    from pipeline.draft_ceiling import oracle_passes

    model = load_policy(policy_dir)
    p1, p2 = [1, 2, 3], [4, 5]
    follow = greedy(model, p1, 12)  # every token the argmax
    assert argmax_hits(model, p1, follow) == [True] * 12
    # cap 8: prefill, then tokens 1-8 accepted and 9 emitted, then 10-11: 3 passes
    assert oracle_passes([True] * 12, 8) == 3 and oracle_passes([True] * 12, None) == 2
    off = [(t + 1) % 24 for t in greedy(model, p2, 9)]  # not the argmax at its first token
    assert not argmax_hits(model, p2, off)[0]
    outputs = [follow, follow[:5], off, off[:3]]  # step order: prompt, then its N samples
    want = {cap: max(oracle_passes(argmax_hits(model, p, o), cap)
                     for p, o in zip([p1, p1, p2, p2], outputs)) for cap in (8, None)}
    none = SimpleNamespace(outputs=outputs, steps=[{"critical_passes": 12}])
    work = [EpochWork(1, policy_dir, [StepWork(6, [p1, p2])], [])]
    result = oracle_ceiling(work, none, N, reference={"passes": 10})
    caps = result["caps"]
    assert result["check"]  # cap 0: one pass a token, the longest response's 12
    assert caps["cap0"]["critical_passes_steps"] == [12]
    assert caps["cap8"]["critical_passes_steps"] == [want[8]]
    assert caps["unbounded"]["critical_passes_steps"] == [want[None]]
    assert caps["unbounded"]["passes"] <= caps["cap16"]["passes"] <= caps["cap8"]["passes"]
    assert caps["cap8"]["over_suffix"] == round(want[8] / 10, 4)
    assert 0 < result["argmax_share"] < 1
    assert "gap_closed" not in result  # no methods given
    # the run's own cap joins the caps; the gap is measured against the oracle at it
    methods = {"none": {"passes": 12, "critical_passes": 12},
               "history+group": {"passes": 11, "critical_passes": 11},
               "history+group+model": {"passes": 7, "critical_passes": 7}}
    got = oracle_ceiling(work, SimpleNamespace(outputs=outputs, steps=none.steps), N,
                         methods=methods, cap=3)
    oracle3 = max(oracle_passes(argmax_hits(model, p, o), 3)
                  for p, o in zip([p1, p1, p2, p2], outputs))
    assert got["caps"]["cap3"]["passes"] == oracle3 and set(CAPS) < set(got["caps"])
    assert oracle3 < 11
    assert got["gap_closed"] == {"cap": 3, "reference": "history+group", "methods": {
        "history+group+model": {"passes": round(4 / (11 - oracle3), 4),
                                "critical_passes": round(4 / (11 - oracle3), 4)}}}


def test_an_empty_response_has_no_marks(policy_dir):
    from pipeline.bench.spec_ceiling import load_policy

    assert argmax_hits(load_policy(policy_dir), [1, 2], []) == []


def test_the_gap_closed_is_printed_a_line_per_method(capsys):
    from rhymectl.spec_tables import render_gaps

    render_gaps({"cap": 8, "reference": "history+group", "methods": {
        "history+group+model": {"passes": 0.3215, "critical_passes": None},
        "suffix": {"passes": -0.5, "critical_passes": -0.25}}})
    text = capsys.readouterr().out
    assert "history+group's passes over the oracle's (cap 8)" in text
    assert "history+group+model: 32% of the total, – of the median step" in text
    assert "suffix: -50% of the total, -25% of the median step" in text
    render_gaps(None)
    render_gaps({"cap": 8, "reference": "history+group", "methods": {}})
    assert capsys.readouterr().out == ""
