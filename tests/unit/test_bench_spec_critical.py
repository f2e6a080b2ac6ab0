"""`bench spec`'s critical-path and GPU-estimate keys: the roofline pass-cost model, the
per-step summary, its aggregation over repeats and the figure's step, by hand."""

from __future__ import annotations

import pytest

from pipeline.bench.spec import MethodResult
from pipeline.bench.spec_summary import figure_step, summarize
from pipeline.bench.spec_repeats import aggregate
from pipeline.costs import H100_7B, Roofline
from pipeline.gpu_cost import HOST_S, PIECEWISE_S


def test_the_h100_roofline_by_hand():
    # weights 15.2 GB / 3.35 TB/s = 4.537 ms; a token 2 x 7.6e9 FLOPs / 989 TFLOPS = 15.37 us;
    # ridge 4.537 ms / 15.37 us = 295 tokens
    assert H100_7B.weights_s == pytest.approx(4.5373e-3, rel=1e-4)
    assert H100_7B.ridge_tokens == pytest.approx(295.2, abs=0.1)
    assert H100_7B.pass_seconds(1) == H100_7B.pass_seconds(295) == H100_7B.weights_s
    assert H100_7B.pass_seconds(1152) == pytest.approx(1152 * 15.2e9 / 989e12)
    assert H100_7B.estimate_s([1, 1152]) == pytest.approx(4.5373e-3 + 17.705e-3, rel=1e-4)
    assert H100_7B.as_dict()["ridge_tokens"] == 295.2
    with pytest.raises(ValueError):
        Roofline("bad", 0, 1, 1, 1)


def step(passes, critical, tail, critical_tau, tail_tau, running, tokens):
    return {"requests": running[0], "passes": passes, "critical_passes": critical,
            "tail_passes": tail, "critical_tau": critical_tau, "tail_tau": tail_tau,
            "running": running, "tokens": tokens}


def results() -> dict[str, MethodResult]:
    # none: two steps of 4 passes of 4 requests, one token each (prefill 40 tokens);
    # spec: the same steps in 2 and 3 passes, verifying 400 tokens at full batch
    none = MethodResult("none", rollout_s=2.0, requests=8, generated=32, passes=8,
                        samples=[(40, 0.1, True), (4, 0.1, False), (4, 0.1, False),
                                 (1, 0.1, False)] * 2,
                        steps=[step(4, 4, 1, 1.0, 1.0, [4, 4, 4, 1], [40, 4, 4, 1]),
                               step(4, 4, 1, 1.0, 1.0, [4, 4, 4, 1], [40, 4, 4, 1])])
    spec = MethodResult("history+group", rollout_s=1.0, requests=8, generated=32, passes=5,
                        drafter_s=0.25, engine_draft_tokens=16,
                        samples=[(40, 0.1, True), (400, 0.1, False),
                                 (40, 0.1, True), (400, 0.1, False), (9, 0.1, False)],
                        steps=[step(2, 2, 0, 3.0, None, [4, 4], [40, 400]),
                               step(3, 3, 1, 4.0, 2.0, [4, 4, 1], [40, 400, 9])])
    return {"none": none, "history+group": spec}


def test_per_step_keys_and_the_gpu_estimate_by_hand():
    s = summarize(results(), temperature=1.0)
    none, spec = s["none"], s["history+group"]
    assert none["passes_per_step"] == 4 and none["passes_per_step_steps"] == [4, 4]
    assert spec["passes_per_step"] == 2.5 and spec["critical_passes_steps"] == [2, 3]
    assert spec["tail_passes"] == 0.5 and spec["critical_tau"] == 3.5
    # a step without a tail has no tail tau; the median is over the steps that have one
    assert spec["tail_tau_steps"] == [None, 2.0] and spec["tail_tau"] == 2.0
    w = H100_7B.weights_s
    # none: 8 passes, all below the ridge (295 tokens): 8 weight reads, the two prefills
    # in piecewise graphs (pipeline.gpu_cost), the decode passes in full ones, overlapped
    # with the host's work; tail: 2 decode passes
    assert none["gpu_estimate_s"] == pytest.approx(8 * w + 2 * PIECEWISE_S, abs=1e-4)
    assert none["gpu_estimate_tail_s"] == pytest.approx(2 * w, abs=1e-4)
    # spec, an engine built for 16 drafts: 3 memory-bound passes and 2 compute-bound ones
    # of 400 tokens (padded to 408, 24 x 17), all piecewise, each followed by the host
    compute = 408 * H100_7B.flops_per_token / H100_7B.peak_flops
    extra = 5 * (PIECEWISE_S + HOST_S)
    assert spec["gpu_estimate_s"] == pytest.approx(3 * w + 2 * compute + extra, abs=1e-4)
    assert spec["gpu_estimate_tail_s"] == pytest.approx(w + PIECEWISE_S + HOST_S, abs=1e-4)
    assert spec["gpu_estimate_speedup"] == pytest.approx(
        (8 * w + 2 * PIECEWISE_S) / (3 * w + 2 * compute + extra), abs=1e-3)
    assert spec["gpu_estimate_with_drafter_s"] == pytest.approx(spec["gpu_estimate_s"] + 0.25)
    assert spec["gpu_estimate_model"] == H100_7B.name


def test_repeats_take_per_step_medians_and_the_median_over_every_step():
    one = summarize(results(), temperature=1.0)
    other = results()
    other["history+group"].steps[1]["critical_passes"] = 5
    two = summarize(other, temperature=1.0)
    three = summarize(other, temperature=1.0)
    merged = aggregate([one, two, three])["history+group"]
    # step 0: 2, 2, 2; step 1: 3, 5, 5 -> per step 2 and 5; over all six values
    # (2 2 2 3 5 5) 2.5, where the median of the repeats' medians (2.5, 3.5, 3.5) is 3.5
    assert merged["critical_passes_steps"] == [2, 5]
    assert merged["critical_passes"] == 2.5
    assert merged["tail_tau_steps"] == [None, 2.0]


def test_the_figure_shows_the_median_step_under_none_for_every_method():
    r = results()
    r["none"].steps.append(step(6, 6, 2, 1.0, 1.0, [4, 4, 4, 4, 1, 1], [40] + [4] * 5))
    r["none"].steps[0]["critical_passes"] = 9
    # none's critical paths 9, 4, 6: the median is 6, step 2; history+group has no step 2
    index, shown = figure_step(r)
    assert index == 2 and list(shown) == ["none"]
    r["none"].steps[2]["critical_passes"] = 3  # 9, 4, 3: the median is step 1
    index, shown = figure_step(r)
    assert index == 1 and shown["history+group"]["passes"] == 3


def test_a_draft_models_forwards_are_priced_on_the_same_gpu():
    """Six forward steps of a draft each 5 % of a memory-bound pass: 0.3 weight reads."""
    rs = results()
    rs["history+group+model"] = MethodResult(**{**vars(rs["history+group"]),
                                                "name": "history+group+model",
                                                "model": {"passes": 2, "steps": 6,
                                                          "step_reads": 0.3}})
    s = summarize(rs, temperature=1.0)
    spec, model = s["history+group"], s["history+group+model"]
    assert "gpu_estimate_model_s" not in spec
    w = H100_7B.weights_s
    assert model["model_passes"] == 2 and model["model_steps"] == 6
    assert model["gpu_estimate_model_s"] == pytest.approx(0.3 * w, abs=1e-4)
    assert model["gpu_estimate_with_model_s"] == pytest.approx(spec["gpu_estimate_s"] + 0.3 * w,
                                                               abs=1e-4)
    assert model["gpu_estimate_model_speedup"] == pytest.approx(
        s["none"]["gpu_estimate_s"] / model["gpu_estimate_with_model_s"], abs=1e-3)
    merged = aggregate([s, s])["history+group+model"]
    assert merged["gpu_estimate_with_model_s"] == model["gpu_estimate_with_model_s"]
