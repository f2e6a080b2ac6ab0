"""`rhymectl bench replay`: recorded responses drafted again, pass for pass (the real
drafter and vLLM's real suffix proposer on made-up token streams; no engine, no model)."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.bench.drafter_sim import InputBatch, Lane
from pipeline.bench.replay import (ReplayStep, _Work, first_revisit, none_path, replay,
                                   replay_step, steps_of)
from pipeline.config.schema import SpecConfig
from pipeline.errors import UsageError
from pipeline.history.store import RolloutRecord, prompt_hash

K = 8


def record(prompt, step, epoch, j, ids) -> RolloutRecord:
    return RolloutRecord(f"p{prompt_hash(prompt)}", prompt_hash(prompt), epoch, step, epoch, j,
                         list(ids), len(ids), "stop", 0.0, 0.0)


def lane_of(prompts, responses, propose=lambda sampled: [[] for _ in sampled], rows=8):
    step = ReplayStep(0, prompts, responses, [])
    batch = InputBatch(rows, 200)
    return Lane("t", _Work(step), batch, propose, 0), batch


def test_without_drafts_a_step_takes_its_longest_response_in_passes():
    lane, _ = lane_of([[1, 2, 3]], [[[5] * 7, [6] * 3]])
    out = replay_step(lane, prompt_tokens=6)
    assert out.path.passes == out.path.critical_passes == 7
    assert out.path.critical_tau == 1.0
    assert none_path(ReplayStep(0, [[1, 2, 3]], [[[5] * 7, [6] * 3]], [])) == out.path


def test_a_draft_of_the_recorded_response_is_accepted_up_to_the_cap():
    """A drafter that always drafts the next K recorded tokens: every pass emits K + 1."""
    responses = [[list(range(10, 10 + n)) for n in (40, 20)]]
    lane, batch = lane_of([[1, 2]], responses)

    def perfect(sampled):
        out = []
        for i, req_id in enumerate(batch.req_ids):
            have = lane.produced[req_id]
            out.append(lane.plan[req_id][have:have + K])
        return out

    lane.propose = perfect
    out = replay_step(lane, prompt_tokens=4)
    # pass 0 (prefill) emits one token, then 9 a pass: 39 more tokens in 5 passes
    assert out.path.critical_passes == 1 + -(-39 // (K + 1))
    # every draft token is accepted but, per request, the one its last pass emits itself
    assert out.drafted - out.accepted == 2
    assert out.emitted == 39 + 19


def test_wrong_drafts_never_change_what_is_emitted():
    responses = [[[7] * 25, [8] * 12]]
    lane, _ = lane_of([[1]], responses, propose=lambda sampled: [[99] * K for _ in sampled])
    out = replay_step(lane, prompt_tokens=2)
    assert out.path.critical_passes == 25 and out.accepted == 0
    assert [lane.batch.token_ids_cpu[0, 0]] == [1]  # the prompt stayed where it was


def _run(prompts, epochs, vary):
    """Records of `epochs` epochs, one step per prompt pair per epoch; `vary(e, j, base)`
    gives sample j's response in epoch e."""
    rng = np.random.default_rng(0)
    base = {prompt_hash(p): rng.integers(20, 200, 60).tolist() for p in prompts}
    records, step = [], 0
    for e in range(epochs):
        for pair in (prompts[:2], prompts[2:]):
            for p in pair:
                records += [record(p, step, e, j, vary(e, j, base[prompt_hash(p)]))
                            for j in range(4)]
            step += 1
    return records


PROMPTS = [[1, 2, 3, 4, 5 + i] for i in range(4)]


def test_history_cuts_the_critical_path_of_repeated_responses():
    """Epoch 1 repeats epoch 0: rhymectl's history drafts nearly every token, and every
    method emits exactly the recorded responses (the lane checks each token)."""
    records = _run(PROMPTS, 2, lambda e, j, base: base[: 40 + 5 * j])
    steps = steps_of(records, {prompt_hash(p): p for p in PROMPTS})
    assert [s.step for s in steps] == [0, 1, 2, 3] and first_revisit(steps) == 2
    result = replay(steps, SpecConfig(method="history+group", num_speculative_tokens=K),
                    ["suffix", "history+group"], 2, 128)
    m = result["methods"]
    assert m["none"]["critical_passes"] == 55 and m["none"]["passes"] == 110
    ours = m["history+group"]
    # with the same 55 tokens in history the longest response needs few passes
    assert ours["critical_passes"] <= 55 / 3, ours
    assert ours["tau"] > 3 and ours["accept_rate"] > 0.5
    assert m["suffix"]["critical_passes"] < 55  # vLLM's cache saw epoch 0 as well
    assert m["suffix"]["vs_suffix"] == 1.0
    assert len(ours["steps"]) == 4  # every step's critical path, summed or not


def test_history_only_and_siblings_only_can_be_replayed():
    records = _run(PROMPTS, 2, lambda e, j, base: base[: 30 + 3 * j])
    steps = steps_of(records, {prompt_hash(p): p for p in PROMPTS})
    result = replay(steps, SpecConfig(method="history+group", num_speculative_tokens=K),
                    ["history", "group"], 2, 128)
    # without siblings, epoch 1's steps still have epoch 0 in history
    assert result["methods"]["history"]["critical_passes"] < 39


def test_unknown_prompts_and_unreplayable_methods_are_refused():
    records = _run(PROMPTS, 1, lambda e, j, base: base[:10])
    with pytest.raises(UsageError, match="not in the run's data set"):
        steps_of(records, {prompt_hash(p): p for p in PROMPTS[:3]})
    steps = steps_of(records, {prompt_hash(p): p for p in PROMPTS})
    with pytest.raises(UsageError, match="ngram cannot be replayed"):
        replay(steps, SpecConfig(), ["ngram"], 0, 128)
    with pytest.raises(UsageError, match="--from-step 9"):
        replay(steps, SpecConfig(), ["suffix"], 9, 128)


def _cli_error(capsys, *args) -> str:
    from rhymectl.app import main

    with pytest.raises(SystemExit) as info:
        main(["bench", "replay", *map(str, args)])
    out, err = capsys.readouterr()
    assert info.value.code == 2 and out == "" and err.count("\n") == 1, err
    return err


def test_the_command_refuses_what_it_cannot_replay(capsys, tmp_path):
    assert "not a run directory" in _cli_error(capsys, tmp_path)
    (tmp_path / "config.yaml").write_text("data: {}\n")
    assert "only spec.* keys and model.path" in _cli_error(capsys, tmp_path,
                                                           "data.train_size=8")
    assert "ngram cannot be replayed" in _cli_error(capsys, tmp_path, "--methods", "ngram")
    assert "unknown method" in _cli_error(capsys, tmp_path, "--methods", "eagle")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.yaml"]  # nothing written


def test_a_draft_model_is_replayed_greedy_whatever_spec_draft_probs_says(monkeypatch):
    """Sampled drafts verified with their probabilities are accepted by the policy's
    distribution, which a recorded token alone does not decide: the replay's drafting
    state is built with spec.draft_probs off (its model drafts the argmax)."""
    from pipeline.bench import replay as replay_module
    from pipeline.rollout import speculation

    built = []

    class Drafting:
        def __init__(self, runner, spec, background=True, policy=None):
            built.append(spec)
            self.proposer = None

    monkeypatch.setattr(speculation, "Drafting", Drafting)
    spec = SpecConfig(method="history+group", num_speculative_tokens=K)
    assert spec.draft_probs
    replay_module.Replayer("history+group+model", spec, 8, 200, 200)
    assert built[0].method == "history+group+model" and built[0].draft_probs is False
