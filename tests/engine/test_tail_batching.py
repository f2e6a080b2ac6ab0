"""Tail batching (`sched.tail_batching`) in real training: vLLM stops the step once enough
groups are complete and drops the rest; deferred prompts come back, pinned after
`max_waits`; a resume rebuilds the queue from the history."""

from __future__ import annotations

import shutil
from collections import Counter

import pytest

from tests.engine.test_loop import history, metrics, train

pytestmark = pytest.mark.deepspeed

TAIL = ("sched.tail_batching.overprovision=0.5", "sched.tail_batching.max_waits=1",
        "data.train_size=8", "spec.method=none", "rollout.temperature=1.0")


def groups(run_dir, step):
    return Counter((r["prompt_id"], r["epoch"]) for r in history(run_dir, step))


def test_tail_batching_trains_the_first_groups_and_brings_the_rest_back(tiny_model, tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    train(tiny_model, a, "train.total_steps=2", *TAIL)
    m = metrics(a)
    # 4 trained of 6 launched (ceil(4 * 1.5)); 2 deferred each step
    assert [(r["tail_launched"], r["tail_deferred"]) for r in m] == [(6, 2), (6, 2)]
    assert m[0]["tail_wait_max"] == 0 and m[1]["tail_wait_max"] == 1  # the deferred came back
    first, second = groups(a, 0), groups(a, 1)
    assert len(first) == len(second) == 4 and set(first.values()) == set(second.values()) == {4}
    assert not set(first) & set(second)  # a group is trained once, never partly
    # step 0 launched stream positions 0-5 (epoch 0); the 2 it deferred were pinned in step 1
    epoch0 = {p for p, e in [*first, *second] if e == 0}
    assert len(epoch0) >= 6
    assert {r["policy_version"] for r in history(a, 1)} == {1}  # generated afresh: on-policy
    assert m[0]["tail_dropped_tokens"] >= 0

    # a run resumed from its step-1 checkpoint (a copy of the finished run without its
    # last checkpoint) cuts back the history and rebuilds the deferred queue from what is
    # left: the same step 1
    shutil.copytree(a, b)
    shutil.rmtree(b / "checkpoints/step-000002")
    train(tiny_model, b, "train.total_steps=2", *TAIL, "--resume")
    assert (b / "checkpoints/step-000002/state.json").is_file()  # step 1 ran again
    assert [r["response_ids"] for r in history(b, 1)] == [r["response_ids"] for r in history(a, 1)]
    assert groups(b, 1) == second
