"""Two nodes on one machine: one torchrun per "node" (`--nnodes 2 --nproc_per_node 1`, c10d
rendezvous on 127.0.0.1), each running the library's rank entry point as a multi-node job
does, must write the run directory that a 2-rank single-node run writes with the same seed.

Equal means: the same set of files, by relative path, each byte for byte the same, except
  - `.writer.lock`: not compared (the holder's host and pid);
  - `metrics.jsonl`, `eval.jsonl`, `history/*.parquet`: the same rows without wall-clock
    fields (`time_*`, `*_s`, `*_per_s`, `gen_seconds`) and without `rollout_bubble_ratio`
    (the idle share of the rollout's wall time; checked to lie in [0, 1]);
  - `checkpoints/*/state.json`: equal without `pid` and without the sha256 and byte length
    of the metrics and eval prefixes it covers (those files hold wall-clock fields; the
    row counts must agree);
  - `index/meta.json`: equal without `sources` (the step files' mtimes and inodes) and
    `sha256` (of `index/history.parquet`, whose schema metadata repeats `sources`);
    `index/history.parquet`: the same rows;
  - `*.safetensors` (policy weights, RNG states): the same tensors bit for bit and the same
    metadata (the header lists metadata keys in an order that varies between processes);
  - the DeepSpeed shards under `checkpoints/*/ds/`: the same names and sizes.
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
from pipeline.loop import launch
from pipeline.loop.lock import LOCK_FILE

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.deepspeed

SETTINGS = ["data.train_batch_size=4", "train.ppo_mini_batch_size=2", "rollout.n=4",
            "rollout.max_tokens=48", "data.max_prompt_length=24", "data.eval_size=4",
            "train.total_steps=2", "run.checkpoint_every=1", "sched.policy=static",
            "spec.method=none", "run.dir=run"]
TIMING = {"rollout_bubble_ratio"}  # timing-derived, besides the wall-clock fields


def env() -> dict[str, str]:
    """What `rhymectl train --nproc` gives its ranks, with this checkout importable from any
    working directory."""
    out = {k: v for k, v in launch.torchrun_env().items() if k != "RHYMECTL_FAULT"}
    out["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    return out


def rank_args(model: Path, *extra: str) -> list[str]:
    return [str(REPO / "sample_configs/tiny.yaml"), f"model.path={model}", *SETTINGS, *extra]


def node_command(node_rank: int, endpoint: str, run_id: str, *args: str,
                 entry: tuple[str, ...] = ("-m", launch.RANK_MODULE)) -> list[str]:
    """One node's torchrun of a 2-node job, one rank per node (as slurm.sh's, scaled down);
    node 0 hosts the rendezvous store, as the first node of a job whose endpoint is its
    host name does."""
    return [sys.executable, "-m", launch.TORCHRUN_MODULE, "--nnodes=2",
            f"--node_rank={node_rank}", "--nproc_per_node=1", "--rdzv_backend=c10d",
            f"--rdzv_endpoint={endpoint}", f"--rdzv_id={run_id}",
            f"--rdzv_conf=is_host={int(node_rank == 0)}", *entry, *args]


def two_nodes(cwds: tuple[Path, Path], args: list[str], logs: Path,
              entry: tuple[str, ...] = ("-m", launch.RANK_MODULE)) -> list[tuple[int, str]]:
    """Both nodes' torchruns, started together; (exit code, stderr) per node."""
    endpoint, run_id = f"127.0.0.1:{free_port()}", uuid.uuid4().hex[:8]
    logs.mkdir(parents=True, exist_ok=True)
    procs = []
    try:
        for node, cwd in enumerate(cwds):
            with open(logs / f"node{node}.log", "w") as log:
                cmd = node_command(node, endpoint, run_id, *args, entry=entry)
                procs.append(subprocess.Popen(cmd, cwd=cwd, env=env(), stdout=log, stderr=log))
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


def timeless(row: dict) -> dict:
    return {k: v for k, v in row.items()
            if not (k.startswith("time_") or k.endswith(("_s", "_per_s")) or k == "gen_seconds"
                    or k in TIMING)}


def rows(run_dir: Path) -> dict[str, list[dict]]:
    """History (step by step), metrics and eval rows, as `timeless` keeps them."""
    history = [r for path in sorted((run_dir / "history").glob("step-*.parquet"))
               for r in pq.read_table(path).to_pylist()]
    logs = {name: [json.loads(line) for line in
                   (run_dir / f"{name}.jsonl").read_text().splitlines()]
            for name in ("metrics", "eval")}
    return {name: [timeless(r) for r in table] for name, table in
            {"history": history, **logs}.items()}


def without(d: dict, *paths: str) -> dict:
    """`d` without the dotted `paths` ("covers.metrics.sha256")."""
    d = json.loads(json.dumps(d))
    for path in paths:
        *parents, last = path.split(".")
        node = d
        for key in parents:
            node = node[key]
        node.pop(last, None)
    return d


def same_file(name: str, a: Path, b: Path) -> bool:
    """`a` and `b` are equal as the module docstring defines it for a file called `name`."""
    skip = ()
    if name.endswith("state.json"):
        skip = ("pid", "covers.metrics.sha256", "covers.metrics.bytes", "covers.eval.sha256",
                "covers.eval.bytes")
    elif name == "index/meta.json":
        skip = ("sources", "sha256")
    if skip:
        return without(json.loads(a.read_text()), *skip) == \
            without(json.loads(b.read_text()), *skip)
    if name == "index/history.parquet":
        return pq.read_table(a).to_pylist() == pq.read_table(b).to_pylist()
    if name.endswith(".safetensors"):
        return tensors(a) == tensors(b)
    if "/ds/" in name:
        return a.stat().st_size == b.stat().st_size
    return a.read_bytes() == b.read_bytes()


def tensors(path: Path) -> tuple[dict, dict]:
    """(metadata, name -> the tensor's raw bytes) of a safetensors file."""
    from safetensors import safe_open

    with safe_open(str(path), "pt") as fh:
        return fh.metadata(), {k: fh.get_tensor(k).numpy().tobytes() for k in fh.keys()}


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
    rowwise = {"metrics.jsonl", "eval.jsonl"} | {f for f in want if f.startswith("history/")}
    differ = [name for name in want if name not in rowwise | {LOCK_FILE}
              and not same_file(name, single / name, nodes / name)]
    assert differ == []
    assert rows(single) == rows(nodes)
    for run_dir in runs:
        for line in (run_dir / "metrics.jsonl").read_text().splitlines():
            assert 0.0 <= json.loads(line)["rollout_bubble_ratio"] <= 1.0
    assert [r["step"] for r in rows(nodes)["metrics"]] == [1, 2]
    assert len(rows(nodes)["history"]) == 2 * 4 * 4  # both ranks' rollouts, each step
    state = json.loads((nodes / "checkpoints/step-000002/state.json").read_text())
    assert state["world_size"] == 2


@pytest.mark.slow
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


LATE_RANK = """import os, sys, time
if os.environ["GROUP_RANK"] != "0":
    time.sleep(3)  # node 1's rank stops after node 0's torchrun, and its store, are gone
print("error: the same bad input on every rank", file=sys.stderr)
sys.exit(2)
"""


def test_a_node_whose_rank_stops_after_the_store_host_exited_still_exits_2(tmp_path):
    """Every rank stops on the same bad input, node 0's first: node 0's torchrun exits and
    takes the rendezvous store with it while node 1's rank still runs. Node 1's torchrun
    must wait for its rank's exit code (2) rather than fail on the lost store (exit 1 and a
    traceback)."""
    script = tmp_path / "late_rank.py"
    script.write_text(LATE_RANK)
    results = two_nodes((tmp_path, tmp_path), [], tmp_path / "logs", entry=(str(script),))
    for code, log in results:
        assert code == 2, log[-3000:]
        assert "Traceback" not in log, log[-3000:]
        assert [line for line in log.splitlines() if line.startswith("error: ")] == \
            ["error: the same bad input on every rank"], log[-3000:]
