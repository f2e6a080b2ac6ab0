"""Fault injection on the real engines: every fault point kills (or fails a write of) a
real `rhymectl train` process, the next process resumes, and what the run directory
finally holds equals an uninterrupted run's rows.

Cost: a process start (vLLM + DeepSpeed) dominates, so each chain is one run directory
that one process after another kills at a different point and the next resumes (the
point list below is ordered so that the run still moves forward), and the uninterrupted
reference is shared. Between processes the directory is checked for gaps; at the end
its rows are compared with the reference. With speculation (the drafter's state and
history through kills and resumes, with and without the run's index):
test_reproducible_spec.py.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.train import checkpoint

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))  # run_audit sits next to scripts/kill_trials.py
import run_audit as audit  # noqa: E402
pytestmark = [pytest.mark.engine, pytest.mark.deepspeed]

STEPS, BATCH, N = 4, 2, 2
TINY = ["data.train_batch_size=2", "train.ppo_mini_batch_size=2", "rollout.n=2",
        "rollout.max_tokens=32", "data.max_prompt_length=24", "data.eval_size=4",
        f"train.total_steps={STEPS}", "run.checkpoint_every=2", "run.eval_every=2"]

# (RHYMECTL_FAULT, expected exit code): -9 = killed by SIGKILL, 1 = the injected OSError.
# With total 4 and checkpoints at 2 and 4, the first three processes start over (no
# checkpoint yet), the rest resume from step 2.
CHAIN_NONE = [
    ("after_metrics_append:2", -9),   # steps 1-2 rows on disk, no checkpoint: the old bug
    ("mid_checkpoint_write", -9),     # shards written, state.json not
    ("after_checkpoint_commit", -9),  # step-2 committed
    ("after_rollout", -9),
    ("after_train", -9),
    ("after_sync", -9),
    ("mid_history_write", -9),
    ("mid_eval", -9),                 # step 4's evaluation, rows of step 3 provisional
    ("mid_index_build", -9),          # step 4's commit: index temp file written
    ("mid_history_write:2:ENOSPC", 1),  # step 4's history file: disk full
    ("mid_checkpoint_write:EACCES", 1),  # step 4's checkpoint: unwritable
]


def train(model: Path, run_dir: Path, *extra: str, fault: str | None = None,
          resume: bool = False) -> subprocess.CompletedProcess:
    import os

    env = {k: v for k, v in os.environ.items() if k != "RHYMECTL_FAULT"}
    if fault:
        env["RHYMECTL_FAULT"] = fault
    cmd = [sys.executable, "-m", "rhymectl", "train", str(REPO / "sample_configs/tiny.yaml"),
           f"model.path={model}", f"run.dir={run_dir}", *TINY, *extra]
    return subprocess.run(cmd + ["--resume"] * resume, capture_output=True, text=True, cwd=REPO,
                          env=env, timeout=600)


def assert_no_gap(run_dir: Path, where: str) -> None:
    """What a killed process leaves: contiguous history steps and metrics rows."""
    snap = audit.snapshot(run_dir)
    steps = sorted({r["step"] for r in snap["history"]})
    assert steps == list(range(len(steps))), f"{where}: history steps {steps}"
    assert [r["step"] for r in snap["metrics"]] == list(range(1, len(snap["metrics"]) + 1)), where
    ckpt = checkpoint.latest(run_dir / "checkpoints")
    if ckpt is not None:
        state = checkpoint.read_state(ckpt)
        assert checkpoint.verify(ckpt, state) is None, where
        covered = state["covers"]
        assert len(steps) >= covered["history_steps"], f"{where}: committed history lost"
        assert len(snap["metrics"]) >= covered["metrics"]["rows"], f"{where}: metrics lost"


def run_chain(model: Path, run_dir: Path, chain, *extra: str) -> None:
    for i, (fault, code) in enumerate(chain):
        proc = train(model, run_dir, *extra, fault=fault, resume=i > 0)
        where = f"after fault {fault}"
        assert proc.returncode == code, f"{where}: exit {proc.returncode}\n{proc.stderr[-2000:]}"
        if code == 1:  # the disk error: one line, the way back named
            errors = [l for l in proc.stderr.splitlines() if l.startswith("error:")]
            assert len(errors) == 1 and "rerun with --resume" in errors[0], proc.stderr[-2000:]
            assert ("no space left on device" in errors[0]) == ("ENOSPC" in fault), errors[0]
            assert "Traceback" not in proc.stderr
        assert_no_gap(run_dir, where)
    proc = train(model, run_dir, *extra, resume=True)
    assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.fixture(scope="module")
def reference_dir(tiny_model, tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("faults") / "reference"
    proc = train(tiny_model, run_dir, "spec.method=none")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return run_dir


@pytest.fixture(scope="module")
def reference(reference_dir) -> dict:
    return audit.snapshot(reference_dir)


def test_every_fault_point_resumes_to_the_uninterrupted_rows_bit_for_bit(
        tiny_model, reference, tmp_path):
    """Processes resumed from the step-2 checkpoint produce steps 3-4 bit for bit as the
    uninterrupted run does (rows, sampled tokens, losses): the resume test of the loop."""
    from pipeline.faults import POINTS

    killed = {f.split(":")[0] for f, code in CHAIN_NONE if code == -9}
    assert killed == set(POINTS)  # every point is exercised
    run_chain(tiny_model, tmp_path / "run", CHAIN_NONE, "spec.method=none")
    got = audit.snapshot(tmp_path / "run")
    report = audit.compare(reference, got, exact=True)
    assert audit.problems(report) == 0, report
    assert len(got["history"]) == STEPS * BATCH * N
    assert [r["step"] for r in got["eval"]] == [0, 2, 4]
    assert got == reference


def _tree(run_dir: Path) -> dict:
    return {str(p.relative_to(run_dir)): p.read_bytes() for p in sorted(run_dir.rglob("*"))
            if p.is_file() and p.name != ".writer.lock"}


def _garble_line(path: Path, index: int) -> None:
    lines = path.read_text().splitlines(keepends=True)
    lines[index] = lines[index][:10] + "\x00garbled" + lines[index][10:]
    path.write_text("".join(lines))


def _other_run_eval(path: Path) -> None:
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    # Another run's rows: same steps, other values (a flipped accuracy alone can be a no-op
    # at 0.5), and one more key, so the bytes always differ.
    path.write_text("".join(json.dumps({"run": "other", **r, "accuracy": 1.0 - r["accuracy"],
                                        "reward_mean": r["reward_mean"] / 2}) + "\n"
                            for r in rows))


CORRUPTIONS = {
    "truncated history step file": (
        lambda d: (d / "history/step-000001.parquet").write_bytes(
            (d / "history/step-000001.parquet").read_bytes()[:300]),
        "step-000001.parquet is corrupt or truncated"),
    "checkpoint missing a DeepSpeed shard": (
        lambda d: next((d / "checkpoints/step-000004/ds").rglob("*optim_states.pt")).unlink(),
        "checkpoints/step-000004 is damaged"),
    "garbled metrics line in the middle": (
        lambda d: _garble_line(d / "metrics.jsonl", 1), "metrics.jsonl: its first 4 rows differ"),
    "eval.jsonl from another run": (
        lambda d: _other_run_eval(d / "eval.jsonl"), "eval.jsonl: its first 3 rows differ"),
}


@pytest.mark.parametrize("damage", list(CORRUPTIONS))
def test_corrupt_files_are_refused_with_one_line_and_nothing_changed(
        tiny_model, reference_dir, tmp_path, damage):
    """Checked before any engine starts, so each case costs a process start only."""
    run_dir = tmp_path / "run"
    shutil.copytree(reference_dir, run_dir)
    corrupt, expected = CORRUPTIONS[damage]
    corrupt(run_dir)
    before = _tree(run_dir)
    proc = train(tiny_model, run_dir, "spec.method=none", resume=True)
    assert proc.returncode == 2, proc.stderr[-2000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and expected in errors[0], proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    assert _tree(run_dir) == before


def test_a_second_writer_is_refused_with_the_holders_host_and_pid(tiny_model, reference_dir,
                                                                   tmp_path):
    """A run directory in use: `train --resume` (a Slurm requeue, a double submission)
    and `index build` stop with one line and exit 2 and change nothing."""
    import socket

    run_dir = tmp_path / "run"
    shutil.copytree(reference_dir, run_dir)
    hold = ("import sys, time\nfrom pipeline.loop.lock import RunLock\n"
            "RunLock(sys.argv[1]).acquire()\nprint('held', flush=True)\ntime.sleep(300)")
    holder = subprocess.Popen([sys.executable, "-c", hold, str(run_dir)], cwd=REPO,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        before = _tree(run_dir)
        proc = train(tiny_model, run_dir, "spec.method=none", "train.total_steps=6", resume=True)
        assert proc.returncode == 2, proc.stderr[-2000:]
        errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
        assert len(errors) == 1, proc.stderr[-2000:]
        assert f"is in use by rhymectl train pid {holder.pid} on host {socket.gethostname()}" \
            in errors[0]
        index = subprocess.run([sys.executable, "-m", "rhymectl", "index", "build", str(run_dir)],
                               capture_output=True, text=True, cwd=REPO, timeout=300)
        assert index.returncode == 2 and f"pid {holder.pid}" in index.stderr, index.stderr
        assert _tree(run_dir) == before
    finally:
        holder.kill()
        holder.wait()
