"""`rhymectl bench e2e` end to end on the real engines: 1 tiny step x 1 seed, both arms,
each run a real `rhymectl train` process (vLLM + DeepSpeed). The order of the arms across
seeds and the statistics over several seeds are tests/unit/test_bench_e2e.py's."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.deepspeed

TINY = ["data.train_batch_size=4", "data.train_size=8", "train.ppo_mini_batch_size=4",
        "rollout.n=4", "rollout.max_tokens=32", "data.max_prompt_length=24", "data.eval_size=6",
        "run.eval_n=2", "run.checkpoint_every=100"]


def test_bench_e2e_one_step_one_seed(tiny_model, tmp_path):
    root = tmp_path / "e2e"
    cmd = [sys.executable, "-m", "rhymectl", "bench", "e2e", str(REPO / "sample_configs/tiny.yaml"),
           f"model.path={tiny_model}", *TINY, "--steps", "1", "--seeds", "0",
           "--run-dir", str(root), "--json"]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    assert set(report) == {"arms", "speedup_e2e", "speedup_rollout", "heldout_diff"}
    assert json.loads((root / "bench-e2e.json").read_text()) == report
    assert (root / "bench-e2e.png").stat().st_size > 10_000
    for arm in ("baseline", "accelerated"):
        a = report["arms"][arm]
        assert a["seeds"] == [0] and [r["steps"] for r in a["runs"]] == [1]
        assert a["curves"]["step"] == [1] and a["heldout"]["step"] == [0, 1]
        assert 0 < a["rollout_share"] < 1 and a["phases_s_per_step"]["train"] > 0
        for run in a["runs"]:
            assert run["final_heldout"]["prompts"] == 6 and run["final_heldout"]["k"] == 2
            config = (Path(run["run_dir"]) / "config.yaml").read_text()
            assert f"seed: {run['seed']}" in config
            assert ("method: none" in config) == (arm == "baseline")
            assert ("policy: static" in config) == (arm == "baseline")
    # speculation ran in the accelerated arm only
    assert report["arms"]["accelerated"]["runs"][0]["spec_tau_mean"] >= 1.0
    assert report["arms"]["baseline"]["runs"][0]["spec_tau_mean"] is None
    for key in ("speedup_e2e", "speedup_rollout"):
        s = report[key]
        assert 0 < s["min"] <= s["median"] <= s["max"]
    d = report["heldout_diff"]
    assert d["runs"] == [1, 1] and d["prompts"] == 6 and "paired" in d["method"]
    assert d["ci95"][0] <= d["mean"] <= d["ci95"][1] and 0 <= d["p"] <= 1
    # seed 0: the baseline first
    assert proc.stderr.index("baseline seed 0:") < proc.stderr.index("accelerated seed 0:")
