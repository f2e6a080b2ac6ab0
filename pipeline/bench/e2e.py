"""`rhymectl bench e2e`: the whole RL step against a baseline, at equal learning.

Two arms train the same steps and seeds: `accelerated` is CONFIG with its overrides as
given, `baseline` the same with the `--baseline` overrides on top (by default no
speculation and static placement). Every (arm, seed) is a fresh training process (the
launcher's entry point, `python -m pipeline.loop.launch`; torchrun with --nproc > 1),
so no arm inherits another's process state (caches, allocator, JIT'd kernels), and the arms
alternate across seeds (baseline first for the 1st, 3rd, ... seed, accelerated first for
the others): drift in the load of a shared machine then hits both arms alike, and each
seed's two runs are neighbours in time, which is why speedups are taken per seed.

Layout under the bench's root (default `run.dir + "-bench-e2e"`):

    ROOT/baseline-seed<S>/      a complete run directory (metrics.jsonl, eval.jsonl, ...)
    ROOT/accelerated-seed<S>/
    ROOT/bench-e2e.json         the summary (`pipeline.bench.e2e_summary`)
    ROOT/bench-e2e.png          step time and learning curves, both arms overlaid
"""

from __future__ import annotations

import json
import shlex
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from pipeline import children
from pipeline.errors import RuntimeFailure, UsageError

ARMS = ("baseline", "accelerated")
DEFAULT_BASELINE = "spec.method=none sched.policy=static"


@dataclass(frozen=True)
class Plan:
    config_path: Path
    overrides: tuple[str, ...]  # CONFIG's overrides: the accelerated arm as given
    baseline: tuple[str, ...]  # applied on top of `overrides` for the baseline arm
    steps: int
    seeds: tuple[int, ...]
    nproc: int
    root: Path

    def arm_overrides(self, arm: str, seed: int | None = None) -> list[str]:
        extra = list(self.overrides) + (list(self.baseline) if arm == "baseline" else [])
        extra.append(f"train.total_steps={self.steps}")
        if seed is not None:
            extra += [f"run.seed={seed}", f"run.dir={self.run_dir(arm, seed)}"]
        return extra

    def run_dir(self, arm: str, seed: int) -> Path:
        return self.root / f"{arm}-seed{seed}"

    def order(self) -> list[tuple[str, int]]:
        """(arm, seed) in run order: the arms alternate which goes first, seed by seed."""
        runs = []
        for i, seed in enumerate(self.seeds):
            runs += [(arm, seed) for arm in (ARMS if i % 2 == 0 else ARMS[::-1])]
        return runs


@dataclass
class RunResult:
    arm: str
    seed: int
    run_dir: Path
    wall_s: float  # the whole process: start-up, evaluations, steps
    summary: dict = field(default_factory=dict)  # the run's summary (as `train --json` prints)


def parse_seeds(text: str) -> tuple[int, ...]:
    try:
        seeds = tuple(int(s) for s in text.split(",") if s.strip())
    except ValueError:
        raise UsageError(f"--seeds {text!r}: give comma-separated integers, e.g. --seeds 0,1,2") from None
    if not seeds or len(set(seeds)) != len(seeds):
        raise UsageError(f"--seeds {text!r}: give one or more distinct integers, e.g. --seeds 0,1,2")
    return seeds


def make_plan(config_path: Path, overrides: list[str], baseline: str, steps: int, seeds: str,
              nproc: int, root: Path | None) -> Plan:
    """Validate both arms' configs (and the model, data and ranks) before anything runs.

    A bad CONFIG override fails as in `train`; a bad `--baseline` override fails with the
    key named and `--baseline:` in front, so it is clear which of the two to fix."""
    from pipeline.config import load_config
    from pipeline.loop.preflight import preflight

    if steps < 1:
        raise UsageError(f"--steps {steps}: give at least 1 step")
    seed_list = parse_seeds(seeds)
    extra = shlex.split(baseline)
    if not extra:
        raise UsageError(f"--baseline is empty: give the overrides that make the baseline, "
                         f"e.g. --baseline '{DEFAULT_BASELINE}'")
    cfg = load_config(config_path, [*overrides, f"train.total_steps={steps}"])
    try:
        base = load_config(config_path, [*overrides, *extra, f"train.total_steps={steps}"])
    except UsageError as exc:
        raise UsageError(f"--baseline: {exc}") from None
    if base == cfg:
        raise UsageError(f"--baseline {baseline!r} changes nothing in the config: both arms would "
                         f"be the same run")
    for config in (cfg, base):
        preflight(config, world_size=nproc)
    root = Path(root) if root is not None else Path(f"{cfg.run.dir}-bench-e2e")
    if root.exists() and not root.is_dir():
        raise UsageError(f"--run-dir {root} is a file; give a folder for the bench's runs")
    return Plan(Path(config_path), tuple(overrides), tuple(extra), steps, seed_list, nproc, root)


def run_arm(plan: Plan, arm: str, seed: int) -> RunResult:
    """One training run for (arm, seed) in fresh processes (the launcher's entry point, under
    torchrun with --nproc > 1); its summary comes back."""
    from pipeline.loop.launch import RANK_MODULE, rank_args, torchrun_command, torchrun_env

    with tempfile.TemporaryDirectory(prefix="rhymectl-e2e-") as tmp:
        summary = Path(tmp) / "summary.json"
        args = rank_args(plan.config_path, plan.arm_overrides(arm, seed), False, True, summary)
        if plan.nproc > 1:
            cmd, env = torchrun_command(plan.nproc, RANK_MODULE, *args), torchrun_env()
        else:
            cmd, env = [sys.executable, "-m", RANK_MODULE, *args], None
        started = time.perf_counter()
        code = children.run(cmd, env=env, stdout=sys.stderr)  # stdout: the bench's --json
        wall = time.perf_counter() - started
        if code == 2:
            raise UsageError(f"bench e2e: the {arm} arm (seed {seed}) was refused (its error is "
                             f"above); fix the config or overrides")
        if code or not summary.is_file():
            raise RuntimeFailure(f"bench e2e: the {arm} arm (seed {seed}) failed (exit {code}): "
                                 f"{' '.join(cmd)}")
        return RunResult(arm, seed, plan.run_dir(arm, seed), wall, json.loads(summary.read_text()))


def run_all(plan: Plan, on_done=lambda result: None) -> list[RunResult]:
    """Every (arm, seed), in `plan.order()`."""
    results = []
    for arm, seed in plan.order():
        results.append(run_arm(plan, arm, seed))
        on_done(results[-1])
    return results


__all__ = ["ARMS", "DEFAULT_BASELINE", "Plan", "RunResult", "make_plan", "parse_seeds",
           "run_all", "run_arm"]
