"""Two nodes on one machine: one torchrun per "node" (`--nnodes 2 --nproc_per_node 1`, c10d
rendezvous on 127.0.0.1), each running the library's rank entry point as a multi-node job
does, must write the run directory that a 2-rank single-node run writes with the same seed.

Equal means every file of the two run directories, by relative path: the same set of
files; byte for byte the same, except
  - `.writer.lock` (the holder's host and pid),
  - `metrics.jsonl`, `eval.jsonl` and the history's parquet rows, which must be equal
    without their wall-clock fields (`pipeline.loop.audit`: `time_*`, `*_s`, `*_per_s`,
    `gen_seconds`) and the timing-derived `rollout_bubble_ratio` (idle share of the
    rollout's wall time, 0 to 1, both runs checked for that range),
  - `checkpoints/*/state.json`, equal without `pid` (the committing process),
  - the DeepSpeed shards under `checkpoints/*/ds/`, which must have the same names and
    sizes (their pickles are not compared byte for byte).
Both runs take `run.dir=run` relative to their own working directory, so their configs
(and fingerprints) are the same file. `sched.policy=static` and `spec.method=none` keep
each rank's rollout batch independent of timing (the dynamic placement and the draft
budget follow measured speeds), so both runs sample the same tokens.

A "node" whose run.dir is not the other's (its own working directory, the same relative
run.dir: same config, another folder, as on node-local disks) stops both ranks at start-up.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from pipeline.distributed import free_port
from pipeline.loop import audit, launch
from pipeline.loop.lock import LOCK_FILE

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.deepspeed

SETTINGS = ["data.train_batch_size=4", "train.ppo_mini_batch_size=2", "rollout.n=4",
            "rollout.max_tokens=48", "data.max_prompt_length=24", "data.eval_size=4",
            "train.total_steps=2", "run.checkpoint_every=1", "sched.policy=static",
            "spec.method=none", "run.dir=run"]
TIMING = {"rollout_bubble_ratio"}  # beyond audit's wall-clock fields


def env() -> dict[str, str]:
    """What `rhymectl train --nproc` gives its ranks, with this checkout importable from any
    working directory."""
    out = {k: v for k, v in launch.torchrun_env().items() if k != "RHYMECTL_FAULT"}
    out["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    return out


def rank_args(model: Path, *extra: str) -> list[str]:
    return [str(REPO / "sample_configs/tiny.yaml"), f"model.path={model}", *SETTINGS, *extra]


def node_command(node_rank: int, endpoint: str, run_id: str, *args: str) -> list[str]:
    """One node's torchrun of a 2-node job, one rank per node (as slurm.sh's, scaled down)."""
    return [sys.executable, "-m", launch.TORCHRUN_MODULE, "--nnodes=2",
            f"--node_rank={node_rank}", "--nproc_per_node=1", "--rdzv_backend=c10d",
            f"--rdzv_endpoint={endpoint}", f"--rdzv_id={run_id}", "-m", launch.RANK_MODULE,
            *args]


def two_nodes(cwds: tuple[Path, Path], args: list[str], logs: Path) -> list[tuple[int, str]]:
    """Both nodes' torchruns, started together; (exit code, stderr) per node."""
    endpoint, run_id = f"127.0.0.1:{free_port()}", uuid.uuid4().hex[:8]
    logs.mkdir(parents=True, exist_ok=True)
    procs = []
    try:
        for node, cwd in enumerate(cwds):
            with open(logs / f"node{node}.log", "w") as log:
                procs.append(subprocess.Popen(node_command(node, endpoint, run_id, *args),
                                              cwd=cwd, env=env(), stdout=log, stderr=log))
        codes = [p.wait(timeout=600) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    return [(code, (logs / f"node{n}.log").read_text()) for n, code in enumerate(codes)]


@pytest.fixture(scope="module")
def runs(tiny_model, tmp_path_factory) -> tuple[Path, Path]:
    """(the 2-rank single-node run, the 2-node run) of the same config."""
    root = tmp_path_factory.mktemp("nodes")
    single, nodes = root / "single", root / "nodes"
    single.mkdir()
    nodes.mkdir()
    cmd = launch.torchrun_command(2, launch.RANK_MODULE, *rank_args(tiny_model))
    proc = subprocess.run(cmd, cwd=single, env=env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for code, log in two_nodes((nodes, nodes), rank_args(tiny_model), root / "logs"):
        assert code == 0, log[-3000:]
    return single / "run", nodes / "run"


def files(run_dir: Path) -> dict[str, int]:
    """Every file under `run_dir`: relative path -> bytes."""
    return {str(p.relative_to(run_dir)): p.stat().st_size
            for p in sorted(run_dir.rglob("*")) if p.is_file()}


def rows(run_dir: Path) -> dict[str, list[dict]]:
    """History, metrics and eval rows without wall-clock fields (`audit.snapshot`) and
    without TIMING."""
    return {name: [{k: v for k, v in r.items() if k not in TIMING} for r in table]
            for name, table in audit.snapshot(run_dir).items()}


def test_two_nodes_write_the_run_directory_of_one_node_with_two_ranks(runs):
    single, nodes = runs
    want, got = files(single), files(nodes)
    assert sorted(got) == sorted(want)
    assert {"config.yaml", "run.json", "metrics.jsonl", "eval.jsonl",
            "history/step-000000.parquet", "history/step-000001.parquet",
            "checkpoints/step-000002/state.json",
            "checkpoints/step-000002/policy/model.safetensors",
            "checkpoints/step-000002/rng-rank1.safetensors"} <= set(want)
    shards = [f for f in want if "/ds/" in f]
    assert any("rank_1" in f for f in shards), shards  # both ranks wrote optimizer shards
    for name in want:
        a, b = single / name, nodes / name
        if name == LOCK_FILE:
            continue
        if name.endswith("state.json"):
            state = [{k: v for k, v in json.loads(p.read_text()).items() if k != "pid"}
                     for p in (a, b)]
            assert state[0] == state[1], name
            assert state[1]["world_size"] == 2
        elif "/ds/" in name:
            assert want[name] == got[name], name
        elif name in ("metrics.jsonl", "eval.jsonl") or name.startswith("history/"):
            continue  # row by row below
        else:
            assert a.read_bytes() == b.read_bytes(), name
    assert rows(single) == rows(nodes)
    for run_dir in runs:
        for line in (run_dir / "metrics.jsonl").read_text().splitlines():
            assert 0.0 <= json.loads(line)["rollout_bubble_ratio"] <= 1.0
    assert [json.loads(line)["step"] for line in
            (nodes / "metrics.jsonl").read_text().splitlines()] == [1, 2]
    assert len(pq.read_table(nodes / "history/step-000001.parquet")) == 4 * 4  # both ranks'


def test_a_node_that_does_not_share_run_dir_stops_every_rank_at_start_up(tiny_model, tmp_path):
    """Same config, same relative run.dir, a different folder on each "node": both ranks
    print the same one line and exit 2, and neither torchrun prints a traceback; nothing
    but the lock was written (rank 0 takes it before the check)."""
    cwds = (tmp_path / "a", tmp_path / "b")
    for cwd in cwds:
        cwd.mkdir()
    results = two_nodes(cwds, rank_args(tiny_model), tmp_path / "logs")
    lines = []
    for code, log in results:
        assert code == 2, log[-3000:]
        errors = [line for line in log.splitlines() if line.startswith("error: ")]
        assert len(errors) == 1, log[-3000:]
        assert "Traceback" not in log, log[-3000:]
        lines.append(errors[0])
    assert lines[0] == lines[1]
    assert lines[0].startswith("error: run.dir = run is not shared between the nodes: rank 1 on ")
    assert "put run.dir on a filesystem every node mounts at the same path" in lines[0]
    written = sorted(str(p.relative_to(tmp_path)) for cwd in cwds for p in cwd.rglob("*"))
    assert written in (["a/run", f"a/run/{LOCK_FILE}"], ["b/run", f"b/run/{LOCK_FILE}"]), written
