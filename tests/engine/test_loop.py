"""The GRPO loop end to end on the real engines (vLLM + DeepSpeed), one and two ranks.

Each run is a real `rhymectl train` process: small batches, a few steps.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.deepspeed

SMALL = ["data.train_batch_size=4", "train.ppo_mini_batch_size=2", "rollout.n=4",
         "rollout.max_tokens=48", "data.max_prompt_length=24", "run.checkpoint_every=1",
         "data.eval_size=12"]


def train(model: Path, run_dir: Path, *extra: str, nproc: int = 1) -> dict:
    proc = train_process(model, run_dir, *extra, nproc=nproc)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout) if proc.stdout.strip() else {}


def train_process(model: Path, run_dir: Path, *extra: str, nproc: int = 1):
    cmd = [sys.executable, "-m", "rhymectl", "train", str(REPO / "sample_configs/tiny.yaml"),
           f"model.path={model}", f"run.dir={run_dir}", *SMALL, *extra, "--json"]
    if nproc > 1:
        cmd += ["--nproc", str(nproc)]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=600)


def metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def history(run_dir: Path, step: int) -> list[dict]:
    return pq.read_table(run_dir / "history" / f"step-{step:06d}.parquet").to_pylist()


@pytest.fixture(scope="module")
def uninterrupted(tiny_model, tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("runs") / "a"
    train(tiny_model, run_dir, "train.total_steps=2")
    return run_dir


def test_two_steps_record_metrics_history_and_checkpoints(uninterrupted):
    m = metrics(uninterrupted)
    assert [r["step"] for r in m] == [1, 2]
    for r in m:
        assert 0.0 <= r["reward_mean"] <= 1.0 and 0.0 <= r["accuracy"] <= 1.0
        assert 0 < r["resp_len_mean"] <= r["resp_len_p90"] <= r["resp_len_max"] <= 48
        for phase in ("rollout", "reward", "train", "sync"):
            assert r[f"time_{phase}_s"] >= 0.0
        assert r["rollout_bubble_ratio"] == 0.0  # one rank: never waits for another
        assert 0.0 <= r["rollout_tail_s"] < r["time_rollout_s"]
        assert r["spec_tau"] >= 1.0  # tiny.yaml drafts with history+group by default
    # vLLM returns logprobs only on sampler-check steps (rollout.logprob_check_every = 10:
    # step 1 here); there the engine samples exactly from the trained weights
    assert m[0]["train_sampler_logprob_diff"] < 1e-4
    assert "train_sampler_logprob_diff" not in m[1]
    for step in (0, 1):
        rows = history(uninterrupted, step)
        assert len(rows) == 4 * 4  # batch × group
        assert {r["policy_version"] for r in rows} == {step}  # on-policy: made by this version
        assert {r["step"] for r in rows} == {step}
        assert all(r["length"] == len(r["response_ids"]) for r in rows)
        assert sorted(r["sample_index"] for r in rows) == sorted(list(range(4)) * 4)
    ckpts = sorted(p.name for p in (uninterrupted / "checkpoints").iterdir())
    assert ckpts == ["step-000001", "step-000002"]
    state = json.loads((uninterrupted / "checkpoints/step-000002/state.json").read_text())
    assert state["step"] == 2 and state["policy_version"] == 2
    policy = uninterrupted / "checkpoints/step-000002/policy"
    assert (policy / "model.safetensors").is_file() and (policy / "tokenizer.json").is_file()


def test_a_replay_counts_the_critical_path_the_engine_took(uninterrupted, capsys):
    """`bench replay` drafts the run's recorded responses again with the run's own method
    and drafter settings: every step's critical path is the one the real engine's pass
    meter logged (every request of a step here starts in its first pass, as replayed)."""
    from rhymectl.app import main

    with pytest.raises(SystemExit) as info:
        main(["bench", "replay", str(uninterrupted), "--methods", "suffix,history+group",
              "--from-step", "0", "--json"])
    assert info.value.code in (0, None)
    result = json.loads(capsys.readouterr().out)
    engine = [r["spec_critical_passes"] for r in metrics(uninterrupted)]
    replayed = result["methods"]["history+group"]["steps"]
    longest = [max(r["length"] for r in history(uninterrupted, s)) for s in (0, 1)]
    assert result["methods"]["none"]["steps"] == longest
    assert len(replayed) == len(engine) == 2
    assert replayed == engine
    assert (uninterrupted / "report" / "bench-replay.png").is_file()


def test_training_changes_the_policy(uninterrupted, tiny_model):
    from safetensors.torch import load_file

    before = load_file(str(tiny_model / "model.safetensors"))
    after = load_file(str(uninterrupted / "checkpoints/step-000002/policy/model.safetensors"))
    assert before.keys() == after.keys()
    assert any(not (before[k] == after[k]).all() for k in before)


def test_vllm_after_training_matches_transformers_on_the_trained_weights(uninterrupted, tiny_model):
    """Weight-sync parity after real DeepSpeed steps: the final held-out eval ran greedily
    in vLLM on pushed weights; transformers on the checkpointed weights must agree."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from pipeline.config import load_config
    from pipeline.loop.batches import PromptSource
    from pipeline.tasks.prompts import eval_prompts, train_rows
    from pipeline.policy.sft import greedy_generate
    from pipeline.tasks.data import resolve_reward

    cfg = load_config(uninterrupted / "config.yaml")
    train_ids = {p.id for p in PromptSource(list(train_rows(cfg.data)), 4, cfg.data.seed).prompts}
    prompts = eval_prompts(cfg.data, train_ids)
    policy = uninterrupted / "checkpoints/step-000002/policy"
    texts = greedy_generate(AutoModelForCausalLM.from_pretrained(policy),
                            AutoTokenizer.from_pretrained(policy), [p.text for p in prompts], 48)
    reward = resolve_reward("sort", partial_credit=True)
    rewards = [reward(p.text, t, p.answer) for p, t in zip(prompts, texts)]
    evals = [json.loads(line) for line in (uninterrupted / "eval.jsonl").read_text().splitlines()]
    assert [e["step"] for e in evals] == [0, 2]
    assert evals[-1]["prompts"] == len(prompts) == 12
    assert evals[-1]["reward_mean"] == pytest.approx(sum(rewards) / len(rewards), abs=1e-9)


def test_two_ranks_under_torchrun_and_a_sigterm_to_rhymectl_alone_stops_them(tiny_model, tmp_path):
    """`rhymectl train --nproc 2`: both ranks' halves of a step persisted once, seer placing
    the batch over both. Then `kill PID` of rhymectl (a process manager's stop) once a
    checkpoint is committed: torchrun and both ranks stop too, the run directory's lock is
    free for `--resume`, one error line. Under history+group+model: every rank's draft
    model warms up on both ranks' responses of the evaluation before step 1 and learns the
    policy's distribution at every response token of both ranks (the teachers gathered in
    the records' order)."""
    from pipeline.loop import lock
    from pipeline.train import checkpoint

    run_dir = tmp_path / "ddp"
    cmd = [sys.executable, "-m", "rhymectl", "train", str(REPO / "sample_configs/tiny.yaml"),
           f"model.path={tiny_model}", f"run.dir={run_dir}", *SMALL, "train.total_steps=200",
           "spec.method=history+group+model", "spec.draft_warmup=eval",
           "spec.draft_warmup_updates=10", "--nproc", "2"]
    proc = subprocess.Popen(cmd, cwd=REPO, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while checkpoint.latest(run_dir / "checkpoints") is None:  # step 1 committed
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()[-3000:]
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)  # to rhymectl only, not its process group
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:  # the test failed before rhymectl stopped
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 143, err[-3000:]
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "stopped by SIGTERM" in errors[0], err[-3000:]
    assert "Traceback" not in err
    left = [p for p in Path("/proc").glob("[0-9]*") if str(run_dir) in _cmdline(p)]
    assert not left, [_cmdline(p) for p in left]
    lock.probe(run_dir)  # raises if a rank still held it

    rows = history(run_dir, 0)
    assert len(rows) == 4 * 4  # both ranks' halves of the batch, persisted once
    assert len({r["prompt_id"] for r in rows}) == 4
    m = metrics(run_dir)[0]
    assert m["step"] == 1
    assert m["rollout_chunks"] >= 16  # sched.policy auto: seer placed the batch over both ranks
    assert m["draft_distilled_tokens"] == m["gen_tokens"] > 0
    # the draft warmed up on both ranks' evaluation responses (12 prompts, greedy and 4
    # samples each), taught by the trainer's forward on both, with no rollout of its own
    assert m["draft_warmup_responses"] == 12 * 5 and "warmup_spec_passes" not in m
    assert m["draft_warmup_distilled_tokens"] > 0
    assert m["draft_warmup_loss_after"] < m["draft_warmup_loss_before"]
    # the cost model the next step places with, measured on both ranks' passes (one step
    # of tiny passes may not determine base and per-token cost: then the default's stay)
    assert m["sched_pass_base_ms"] > 0 and m["sched_pass_per_token_ms"] > 0 and m["sched_tau"] >= 1.0
    assert 0.0 <= m["rollout_bubble_ratio"] < 1.0 and 0.0 <= m["rollout_tail_s"] <= m["time_rollout_s"]
    latest = checkpoint.latest(run_dir / "checkpoints")
    assert json.loads((latest / "state.json").read_text())["world_size"] == 2


def _cmdline(proc_dir: Path) -> str:
    try:
        return (proc_dir / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""
