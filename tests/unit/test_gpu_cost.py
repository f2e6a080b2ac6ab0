"""What a pass costs on a GPU beyond the roofline (`pipeline.gpu_cost`): the CPU/GPU overlap
that vLLM's async scheduling gives `spec.method none` and takes from every speculative
method, and the CUDA graph a pass replays (full only where every request schedules
1 + K tokens), by hand on the H100 7B roofline; and `bench spec`'s GPU estimate with them."""

from __future__ import annotations

import pytest

from pipeline.bench.spec import MethodResult
from pipeline.bench.spec_summary import summarize
from pipeline.costs import H100_7B
from pipeline.gpu_cost import EAGER_S, HOST_S, PIECEWISE_S, GpuPassModel, VllmEngine

W = H100_7B.weights_s  # 4.537 ms: a memory-bound pass
TOKEN_S = H100_7B.flops_per_token / H100_7B.peak_flops  # 15.4 us a token, compute-bound
MODEL = GpuPassModel(H100_7B)
NONE = VllmEngine.built_for(0, 256)
DRAFT16 = VllmEngine.built_for(16, 256)  # rhymectl's drafters: max(8, thin 16)
DRAFT8 = VllmEngine.built_for(8, 256)


def test_only_an_engine_without_speculation_schedules_asynchronously():
    assert NONE.async_scheduling and not DRAFT8.async_scheduling
    assert not DRAFT16.async_scheduling


def test_the_lost_overlap_adds_the_hosts_work_to_every_pass():
    """128 requests, one token each, no drafts: a full graph on both engines' terms, but
    without async scheduling the host's millisecond follows the GPU's pass."""
    assert MODEL.pass_seconds(128, 128, NONE) == pytest.approx(W)  # max(W, 1 ms)
    assert NONE.graph(128, 128) == "full"
    # the speculative engine's pass that drafts nothing: not uniform at 17 tokens a request
    assert DRAFT16.graph(128, 128) == "piecewise"
    assert MODEL.pass_seconds(128, 128, DRAFT16) == pytest.approx(W + PIECEWISE_S + HOST_S)
    assert HOST_S == 1.0e-3 and PIECEWISE_S == 0.4e-3 and EAGER_S == 2.1e-3


def test_full_graphs_are_keyed_to_1_plus_k_tokens_a_request():
    # 10 requests verifying 8 drafts: uniform for an engine built for 8, not for one built
    # for 16, which replays a piecewise graph padded to 102 tokens (6 x 17)
    assert DRAFT8.graph(90, 10) == "full" and DRAFT16.graph(90, 10) == "piecewise"
    assert DRAFT16.padded(90) == 102 and DRAFT8.padded(90) == 90
    assert DRAFT16.graph(170, 10) == "full"  # every request verifies 16
    assert MODEL.pass_seconds(90, 10, DRAFT8) == pytest.approx(W + HOST_S)
    assert MODEL.pass_seconds(90, 10, DRAFT16) == pytest.approx(W + PIECEWISE_S + HOST_S)


def test_capture_sizes_are_multiples_of_1_plus_k_below_512_tokens():
    sizes = DRAFT16.capture_sizes()
    assert all(s % 17 == 0 for s in sizes) and sizes[-1] == 510 and len(sizes) == 30
    assert NONE.capture_sizes()[:5] == [1, 2, 4, 8, 16] and NONE.capture_sizes()[-1] == 512
    # more tokens than the largest graph: no graph at all
    assert DRAFT16.graph(1152, 128) == "eager"
    assert MODEL.pass_seconds(1152, 128, DRAFT16) == pytest.approx(
        1152 * TOKEN_S + EAGER_S + HOST_S)
    assert VllmEngine.built_for(0, 256, enforce_eager=True).graph(1, 1) == "eager"


def test_the_estimate_splits_the_roofline_the_host_and_the_graphs():
    passes = [(1152, 128), (90, 10), (170, 10)]
    est = MODEL.estimate(passes, DRAFT16)
    assert est["passes"] == {"full": 1, "piecewise": 1, "eager": 1}
    assert est["roofline_s"] == pytest.approx(1152 * TOKEN_S + 2 * W)
    assert est["host_s"] == pytest.approx(3 * HOST_S)
    assert est["graphs_s"] == pytest.approx(EAGER_S + PIECEWISE_S)
    assert est["s"] == pytest.approx(est["roofline_s"] + est["host_s"] + est["graphs_s"])


def test_drafting_pays_at_small_batches_only():
    """At tau 3.4 (history+group's on the reference run) 8 drafts a request gain on plain
    decoding while the pass is cheap, and lose once 9 tokens a request leave the graphs
    and turn it compute-bound: 128 requests x 9 = 1,152 tokens cost 20.8 ms against 3.4 x
    4.5 ms of plain passes."""
    assert MODEL.draft_pays(16, 8, 3.4, DRAFT16, NONE)
    assert not MODEL.draft_pays(128, 8, 3.4, DRAFT16, NONE)
    assert MODEL.break_even_rows(8, 3.4, DRAFT16, NONE) == 89
    assert MODEL.break_even_rows(8, 2.5, DRAFT16, NONE) == 59


def run(name, draft_tokens, steps) -> MethodResult:
    samples = [(t, 0.1, i == 0) for s in steps for i, t in enumerate(s["tokens"])]
    return MethodResult(name, rollout_s=1.0, requests=4, generated=16, passes=len(samples),
                        samples=samples, steps=steps, engine_draft_tokens=draft_tokens,
                        max_num_seqs=256)


def step(running, tokens):
    return {"requests": running[0], "passes": len(tokens), "critical_passes": len(tokens),
            "tail_passes": 1, "critical_tau": 1.0, "tail_tau": 1.0, "running": running,
            "tokens": tokens}


def test_bench_specs_gpu_estimate_prices_the_overlap_and_the_graphs():
    """none: a 40-token prefill (piecewise) and 3 decode passes (full graphs, overlapped);
    history+group (built for 16): the prefill, a pass of 4 x 9 tokens (piecewise, padded to
    51) and one of 1 x 17 (full), each with the host's millisecond after it."""
    none = run("none", 0, [step([4, 4, 4, 1], [40, 4, 4, 1])])
    spec = run("history+group", 16, [step([4, 4, 1], [40, 36, 17])])
    s = summarize({"none": none, "history+group": spec}, temperature=1.0)
    assert s["none"]["gpu_estimate_s"] == pytest.approx(4 * W + PIECEWISE_S, abs=1e-4)
    assert s["none"]["gpu_estimate_host_s"] == 0.0
    h = s["history+group"]
    assert h["gpu_estimate_s"] == pytest.approx(3 * W + 2 * PIECEWISE_S + 3 * HOST_S, abs=1e-4)
    assert h["gpu_estimate_host_s"] == pytest.approx(3 * HOST_S, abs=1e-4)
    assert h["gpu_estimate_graphs_s"] == pytest.approx(2 * PIECEWISE_S, abs=1e-4)
    assert h["gpu_estimate_roofline_s"] == pytest.approx(3 * W, abs=1e-4)
    assert (h["gpu_estimate_full_passes"], h["gpu_estimate_piecewise_passes"],
            h["gpu_estimate_eager_passes"]) == (1, 2, 0)
    assert h["gpu_estimate_speedup"] == pytest.approx(
        (4 * W + PIECEWISE_S) / (3 * W + 2 * PIECEWISE_S + 3 * HOST_S), abs=1e-3)
