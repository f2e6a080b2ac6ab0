"""`bench replay --ceiling` (`pipeline.bench.replay_ceiling`): the oracle on a run's recorded
steps whose sampling policy is on disk, on a small random transformers model: a checkpoint
maps to the policy version it holds, a step sampled by an unknown version is left out,
cap 0 reproduces none's critical path, and the methods are summed on the covered steps."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from pipeline.bench.replay import ReplayStep, none_path
from pipeline.bench.replay_ceiling import policy_dirs, replay_ceiling, step_version
from pipeline.bench.spec_ceiling import argmax_hits, load_policy
from pipeline.draft_ceiling import oracle_passes


@pytest.fixture(scope="module")
def policy_dir(random_llama_dir):
    return random_llama_dir


def step(sid: int, version: int, prompts, responses) -> ReplayStep:
    records = [SimpleNamespace(policy_version=version)] * sum(map(len, responses))
    return ReplayStep(sid, prompts, responses, records)


def test_checkpoints_map_to_the_versions_they_hold(tmp_path, policy_dir):
    run = tmp_path / "run"
    for name, version, weights in (("step-000004", 4, True), ("step-000008", 8, False)):
        d = run / "checkpoints" / name
        (d / "policy").mkdir(parents=True)
        (d / "state.json").write_text(json.dumps({"policy_version": version}))
        if weights:
            (d / "policy" / "model.safetensors").write_bytes(b"")
    (run / "checkpoints" / "step-000009").mkdir()  # no state.json: being written
    found = policy_dirs(run, str(policy_dir))
    assert found == {0: policy_dir, 4: run / "checkpoints" / "step-000004" / "policy"}
    assert step_version(step(0, 3, [[1]], [[[2]]])) == 3
    assert step_version(ReplayStep(0, [[1]], [[[2], [3]]], [SimpleNamespace(policy_version=1),
                                                             SimpleNamespace(policy_version=2)])) is None


def test_the_oracle_on_the_steps_whose_policy_is_known(policy_dir):
    model = load_policy(policy_dir)
    torch.manual_seed(1)
    p1, p2 = [1, 2, 3], [4, 5]
    responses = [[torch.randint(0, 24, (n,)).tolist() for n in (9, 4)],
                 [torch.randint(0, 24, (n,)).tolist() for n in (6, 7)]]
    steps = [step(0, 0, [p1, p2], responses),  # before --from-step: history only
             step(1, 0, [p1, p2], responses),
             step(2, 5, [p2, p1], responses)]  # no policy of version 5 on disk
    nones = [none_path(st).critical_passes for st in steps]
    result = {"methods": {"none": {"steps": nones}, "suffix": {"steps": [7, 6, 5]},
                          "history+group": {"steps": [8, 5, 4]}}}
    got = replay_ceiling(steps, {0: policy_dir}, result, first_measured=1)
    assert got["steps"] == [1]
    assert got["check"] and got["caps"]["cap0"]["critical_passes_steps"] == [nones[1]]
    want = max(oracle_passes(argmax_hits(model, p, r), 8)
               for p, group in zip([p1, p2], responses) for r in group)
    assert got["caps"]["cap8"]["critical_passes_steps"] == [want]
    assert got["caps"]["cap8"]["over_suffix"] == round(want / 6, 4)
    assert got["methods"] == {"none": nones[1], "suffix": 6, "history+group": 5}
    assert "gap_closed" not in got  # the result names no draft cap
    assert replay_ceiling(steps, {}, result, first_measured=1) == {"steps": []}
    # with the run's draft cap: each method against history+group, on the covered step
    result["num_speculative_tokens"] = 2
    got = replay_ceiling(steps, {0: policy_dir}, result, first_measured=1)
    want2 = max(oracle_passes(argmax_hits(model, p, r), 2)
                for p, group in zip([p1, p2], responses) for r in group)
    assert got["caps"]["cap2"]["critical_passes_steps"] == [want2]
    gaps = got["gap_closed"]
    assert gaps["cap"] == 2 and set(gaps["methods"]) == {"suffix"}
    share = round((5 - 6) / (5 - want2), 4) if want2 < 5 else None
    assert gaps["methods"]["suffix"] == {"passes": share, "critical_passes": share}
