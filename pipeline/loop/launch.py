"""Start a run: in this process (one rank, or a rank that torchrun started), or by starting
torchrun with N ranks on this node (`--nproc N`). Multi-node jobs call torchrun themselves
(`torchrun ... -m rhymectl train ...`; see sample_configs/slurm.sh)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from pipeline.config import Config
from pipeline.errors import RuntimeFailure
from pipeline.loop import lock, rundir


def under_torchrun() -> bool:
    return "TORCHELASTIC_RUN_ID" in os.environ or "LOCAL_RANK" in os.environ


def launch(cfg: Config, config_path: Path, overrides: list[str], resume: bool, force: bool,
           nproc: int, console, json_out: bool = False) -> dict | None:
    """Returns the run summary on the rank that reports (rank 0), else None."""
    if nproc > 1 and not under_torchrun():
        rundir.check_run_dir(cfg, resume, force)  # fail here, before starting the ranks
        lock.probe(cfg.run.dir)  # rank 0 takes the lock itself
        return spawn(config_path, overrides, resume, force, nproc, json_out)
    from pipeline.loop.run import run  # which checks the run directory on every rank

    return run(cfg, resume, force, console)


def torchrun_command(nproc: int, module: str, *args: str) -> list[str]:
    """`python -m module args` on `nproc` local ranks under torchrun."""
    from pipeline.loop.dist import free_port

    return [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}",
            "--master_addr=127.0.0.1", f"--master_port={free_port()}", "-m", module, *args]


def torchrun_env() -> dict[str, str]:
    """Each rank keeps its vLLM engine in-process and one OpenMP thread per rank."""
    return dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="0", OMP_NUM_THREADS="1")


def spawn(config_path: Path, overrides: list[str], resume: bool, force: bool, nproc: int,
          json_out: bool) -> None:
    cmd = torchrun_command(nproc, "rhymectl", "train", str(config_path), *overrides)
    cmd += ["--resume"] * resume + ["--force"] * force + ["--json"] * json_out
    code = subprocess.call(cmd, env=torchrun_env())
    if code == 2:
        sys.exit(2)  # a rank already printed the usage error
    if code:
        raise RuntimeFailure(f"torchrun exited with code {code}; see the ranks' errors above")
    return None
