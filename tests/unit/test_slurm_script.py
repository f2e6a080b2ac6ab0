"""sample_configs/slurm.sh under a fake Slurm: stub `srun`, `scontrol` and `rhymectl` on the
PATH (put there by a stub venv's `activate`, as the real one puts the project's), fake
SLURM_* variables. What it would run: the dry run for the whole job, then one torchrun per
node with the GPUs Slurm granted, the rendezvous on the first node and `--resume`; and on
USR1 (the time limit near) it stops the step and requeues the job."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "sample_configs" / "slurm.sh"

SRUN = """#!/usr/bin/env bash
printf '%s\\n' "$@" > "$STUB_DIR/srun.args"
env | grep -E '^(HF_|TRANSFORMERS_|VLLM_ENABLE_V1_MULTIPROCESSING=)' | sort > "$STUB_DIR/srun.env"
if [[ ${STUB_SRUN:-} == hang ]]; then
  trap 'echo TERM > "$STUB_DIR/srun.signal"; exit 143' TERM
  touch "$STUB_DIR/srun.started"
  while :; do sleep 0.05; done
fi
exit "${STUB_SRUN_EXIT:-0}"
"""
SCONTROL = """#!/usr/bin/env bash
if [[ $1 == show && $2 == hostnames ]]; then
  echo "$3" > "$STUB_DIR/nodelist"; printf 'gpu-a17\\ngpu-a18\\n'
else
  echo "$*" >> "$STUB_DIR/scontrol.log"
fi
"""
RHYMECTL = """#!/usr/bin/env bash
printf '%s\\n' "$@" > "$STUB_DIR/rhymectl.args"
exit "${STUB_DRY_RUN_EXIT:-0}"
"""


@pytest.fixture
def slurm(tmp_path):
    """(the job's environment, the stubs' folder): 2 nodes of 4 GPUs, submitted from
    tmp_path, whose .venv/bin/activate puts the stubs first on the PATH."""
    stubs = tmp_path / "stubs"
    stubs.mkdir()
    for name, text in (("srun", SRUN), ("scontrol", SCONTROL), ("rhymectl", RHYMECTL)):
        (stubs / name).write_text(text)
        (stubs / name).chmod(0o755)
    venv = tmp_path / ".venv" / "bin"
    venv.mkdir(parents=True)
    (venv / "activate").write_text(f'export VIRTUAL_ENV="{tmp_path}/.venv" PATH="{stubs}:$PATH"\n')
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "STUB_DIR": str(stubs),
           "SLURM_SUBMIT_DIR": str(tmp_path), "SLURM_JOB_ID": "4242", "SLURM_NNODES": "2",
           "SLURM_JOB_NODELIST": "gpu-a[17-18]", "SLURM_GPUS_ON_NODE": "4",
           "SLURM_CPUS_PER_TASK": "64"}
    return env, stubs


def run(env, *args, **popen) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *args], env=env, capture_output=True, text=True,
                          timeout=60, **popen)


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines()


def test_the_script_parses():
    assert subprocess.run(["bash", "-n", str(SCRIPT)]).returncode == 0


def test_one_torchrun_per_node_with_the_gpus_slurm_granted(slurm):
    env, stubs = slurm
    proc = run(env, "sample_configs/gpu-7b.yaml", "rollout.n=4")
    assert proc.returncode == 0, proc.stderr
    assert lines(stubs / "nodelist") == ["gpu-a[17-18]"]
    assert lines(stubs / "rhymectl.args") == [
        "train", "sample_configs/gpu-7b.yaml", "rollout.n=4", "--resume", "--nproc", "4",
        "--nnodes", "2", "--dry-run"]
    args = lines(stubs / "srun.args")
    assert args == [
        "--kill-on-bad-exit=1", "--cpus-per-task=64", "python", "-m", "pipeline.loop.torchrun",
        "--nnodes=2", "--nproc_per_node=4", "--rdzv_id=4242-0", "--rdzv_backend=c10d",
        "--rdzv_endpoint=gpu-a17:29500",
        "-m", "rhymectl", "train", "sample_configs/gpu-7b.yaml", "rollout.n=4", "--resume"]
    assert lines(stubs / "srun.env") == ["HF_DATASETS_OFFLINE=1", "HF_HUB_OFFLINE=1",
                                         "TRANSFORMERS_OFFLINE=1",
                                         "VLLM_ENABLE_V1_MULTIPROCESSING=0"]
    assert not (stubs / "scontrol.log").exists()  # nothing requeued


def test_torchrun_accepts_the_command_line(slurm):
    """The flags the script passes are torchrun's own (its parser, not a copy of it)."""
    from torch.distributed.run import get_args_parser

    env, stubs = slurm
    assert run(env, "c.yaml").returncode == 0
    args = lines(stubs / "srun.args")
    parsed = get_args_parser().parse_args(args[args.index("pipeline.loop.torchrun") + 1:])
    assert (parsed.nnodes, parsed.nproc_per_node, parsed.rdzv_backend) == ("2", "4", "c10d")
    assert parsed.rdzv_endpoint == "gpu-a17:29500" and parsed.module
    assert parsed.training_script == "rhymectl" and parsed.training_script_args[-1] == "--resume"


def test_gpus_from_slurm_gpus_per_node_and_a_requeued_rendezvous(slurm):
    env, stubs = slurm
    env = {k: v for k, v in env.items() if k != "SLURM_GPUS_ON_NODE"}
    env.update(SLURM_GPUS_PER_NODE="h100:8", SLURM_RESTART_COUNT="3", RDZV_PORT="29611")
    assert run(env, "c.yaml").returncode == 0
    args = lines(stubs / "srun.args")
    assert "--nproc_per_node=8" in args and "--rdzv_id=4242-3" in args
    assert "--rdzv_endpoint=gpu-a17:29611" in args
    assert lines(stubs / "rhymectl.args")[-5:] == ["--nproc", "8", "--nnodes", "2", "--dry-run"]


def test_srun_asks_for_the_jobs_cpus_per_task(slurm):
    """Slurm 22.05 and later: srun does not inherit sbatch's --cpus-per-task (the variable
    SLURM_CPUS_PER_TASK is set, but the step gets one CPU per task), so every rank of a node,
    with its engine loop, tokenisers, drafter threads and ZeRO-3 hooks, would share one CPU.
    The step asks for them again; a job that asked for none leaves srun's default."""
    env, stubs = slurm
    assert run(env, "c.yaml").returncode == 0
    args = lines(stubs / "srun.args")
    assert args[:args.index("python")] == ["--kill-on-bad-exit=1", "--cpus-per-task=64"]
    env = {k: v for k, v in env.items() if k != "SLURM_CPUS_PER_TASK"}
    assert run(env, "c.yaml").returncode == 0
    args = lines(stubs / "srun.args")
    assert args[:args.index("python")] == ["--kill-on-bad-exit=1"]


def test_no_gpus_is_one_line_and_exit_2(slurm):
    env, stubs = slurm
    env = {k: v for k, v in env.items() if k != "SLURM_GPUS_ON_NODE"}
    proc = run(env, "c.yaml")
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: Slurm reports no GPUs on this node") \
        and proc.stderr.count("\n") == 1, proc.stderr
    assert "#SBATCH --gpus-per-node=N" in proc.stderr
    assert not (stubs / "srun.args").exists()


def test_a_failed_dry_run_starts_nothing(slurm):
    env, stubs = slurm
    proc = run(dict(env, STUB_DRY_RUN_EXIT="2"), "c.yaml")
    assert proc.returncode == 2
    assert not (stubs / "srun.args").exists()


def test_the_job_ends_with_the_steps_exit_code(slurm):
    env, stubs = slurm
    assert run(dict(env, STUB_SRUN_EXIT="3"), "c.yaml").returncode == 3
    assert not (stubs / "scontrol.log").exists()


def test_usr1_stops_the_step_and_requeues_the_job(slurm):
    """Slurm's `--signal=B:USR1@120`: the script passes SIGTERM to srun (which passes it to
    torchrun, which stops the ranks), waits for the step to end, then requeues."""
    env, stubs = slurm
    proc = subprocess.Popen(["bash", str(SCRIPT), "c.yaml"], env=dict(env, STUB_SRUN="hang"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not (stubs / "srun.started").exists():
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
            time.sleep(0.05)
        proc.send_signal(signal.SIGUSR1)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert lines(stubs / "srun.signal") == ["TERM"]
    assert lines(stubs / "scontrol.log") == ["requeue 4242"]
    assert "stopping the ranks and requeueing job 4242" in err
