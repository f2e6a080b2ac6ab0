"""Start a run: in this process (one rank, or a rank that torchrun started), or by starting
torchrun with N ranks on this node (`--nproc N`). Multi-node jobs start one torchrun per
node themselves (`python -m pipeline.loop.torchrun --nnodes ... -m rhymectl train ...`; see
sample_configs/slurm.sh); their ranks check that run.dir is shared (`loop.shared_fs`).

Ranks that the library starts itself (`--nproc N`, the benches' training run) run this
module's entry point, never the CLI:

    python -m pipeline.loop.launch CONFIG [key=value ...] [--resume] [--force] [--summary FILE]

It logs one plain line per step on stderr (rank 0), writes the run summary as JSON to FILE
(rank 0) and reports a bad input as one `error: ...` line with exit code 2.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path

from pipeline import children, distributed
from pipeline.atomic import write_json_atomic
from pipeline.config import Config, load_config
from pipeline.errors import DEBUG_ENV, RuntimeFailure, UsageError
from pipeline.loop import lock, rundir
from pipeline.loop.metrics import eval_line, format_line
from pipeline.loop.preflight import preflight
from pipeline.loop.run import ViewFactory, run
from pipeline.process_exit import exit_now

RANK_MODULE = "pipeline.loop.launch"  # this module, as `python -m` runs it
TORCHRUN_MODULE = "pipeline.loop.torchrun"  # torchrun, quiet when a signal stops it


def under_torchrun() -> bool:
    return "TORCHELASTIC_RUN_ID" in os.environ or "LOCAL_RANK" in os.environ


def launch(cfg: Config, config_path: Path, overrides: list[str], resume: bool, force: bool,
           nproc: int, view: ViewFactory | None = None) -> dict | None:
    """The run summary on the rank that reports (rank 0, or this process after starting
    `nproc` ranks), else None."""
    if nproc > 1 and not under_torchrun():
        rundir.check_run_dir(cfg, resume, force)  # fail here, before starting the ranks
        lock.probe(cfg.run.dir)  # rank 0 takes the lock itself
        return spawn(config_path, overrides, resume, force, nproc)
    return run_rank(cfg, resume, force, view)  # which checks the run directory on every rank


def run_rank(cfg: Config, resume: bool, force: bool, view: ViewFactory | None) -> dict | None:
    """`run` on this rank. A rank that stops on bad input leaves the process group before
    it exits (it raised between collectives, so it has none in flight)."""
    try:
        return run(cfg, resume, force, view)
    except UsageError:
        distributed.leave()
        raise


def torchrun_command(nproc: int, module: str, *args: str) -> list[str]:
    """`python -m module args` on `nproc` local ranks under torchrun."""
    return [sys.executable, "-m", TORCHRUN_MODULE, f"--nproc_per_node={nproc}",
            "--master_addr=127.0.0.1", f"--master_port={distributed.free_port()}", "-m", module,
            *args]


def torchrun_env() -> dict[str, str]:
    """Each rank keeps its vLLM engine in-process and one OpenMP thread per rank."""
    return dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="0", OMP_NUM_THREADS="1")


def rank_args(config_path: Path, overrides: list[str], resume: bool, force: bool,
              summary: Path) -> list[str]:
    return [str(config_path), *overrides, *["--resume"] * resume, *["--force"] * force,
            "--summary", str(summary)]


def spawn(config_path: Path, overrides: list[str], resume: bool, force: bool,
          nproc: int) -> dict:
    """Run `nproc` ranks of this module's entry point under torchrun; rank 0's summary."""
    with tempfile.TemporaryDirectory(prefix="rhymectl-launch-") as tmp:
        summary = Path(tmp) / "summary.json"
        cmd = torchrun_command(nproc, RANK_MODULE, *rank_args(config_path, overrides, resume,
                                                           force, summary))
        code = children.run(cmd, env=torchrun_env(), stdout=sys.stderr)  # stdout: --json
        _exit_like(code, "torchrun")
        return json.loads(summary.read_text())


def run_subprocess(config_path: Path, overrides: list[str], resume: bool, force: bool) -> dict:
    """One rank in a fresh process (the benches' training run); its summary."""
    with tempfile.TemporaryDirectory(prefix="rhymectl-launch-") as tmp:
        summary = Path(tmp) / "summary.json"
        cmd = [sys.executable, "-m", RANK_MODULE, *rank_args(config_path, overrides, resume, force,
                                                          summary)]
        code = children.run(cmd, stdout=sys.stderr)  # keep stdout for --json
        _exit_like(code, "the training run")
        return json.loads(summary.read_text())


def _exit_like(code: int, what: str) -> None:
    if code == 2:
        sys.exit(2)  # a rank already printed the usage error
    if code:
        raise RuntimeFailure(f"{what} exited with code {code}; see the ranks' errors above")


@contextmanager
def step_log(total: int, done: int):
    """Rank 0's progress without a console: one plain line per step on stderr."""

    class _Log:
        def __init__(self):
            self.done = done

        def update(self, record: dict) -> None:
            self.done += 1
            print(f"[{self.done}/{total}] {format_line(record)}", file=sys.stderr, flush=True)
            self.show_eval(record)

        def show_eval(self, record: dict) -> None:
            line = eval_line(record)
            if line is not None:
                print(line, file=sys.stderr, flush=True)

    yield _Log()


def main(argv: list[str]) -> int:
    """One rank: CONFIG [key=value ...] [--resume] [--force] [--summary FILE]."""
    flags = {"--resume", "--force"}
    summary = None
    if "--summary" in argv:
        i = argv.index("--summary")
        summary, argv = Path(argv[i + 1]), argv[:i] + argv[i + 2:]
    config, *rest = argv
    overrides = [a for a in rest if a not in flags]
    try:
        cfg = load_config(Path(config), overrides)
        preflight(cfg, world_size=int(os.environ.get("WORLD_SIZE", 1)))
        result = run_rank(cfg, "--resume" in rest, "--force" in rest, step_log)
    except Exception as exc:  # noqa: BLE001 — a rank's failure becomes its exit code
        if os.environ.get(DEBUG_ENV) == "1":
            raise
        known = isinstance(exc, (UsageError, RuntimeFailure))
        message = str(exc) if known else (f"{type(exc).__name__}: {exc} (rerun with --debug "
                                          f"for the traceback)")
        print(f"error: {message}", file=sys.stderr, flush=True)
        return getattr(exc, "exit_code", 1)
    if result is not None and summary is not None:
        write_json_atomic(summary, result)
    return 0


if __name__ == "__main__":
    exit_now(main(sys.argv[1:]))
