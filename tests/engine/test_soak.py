"""Opt-in soak (RHYMECTL_SOAK=1; RHYMECTL_SOAK_STEPS, default 500): the tiny config with
history+group for hundreds of steps must keep resident memory flat after warm-up, the
history index within its bound, and the step time from drifting. Far too long for CI;
scripts/soak.py is the same run with a plot."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.engine, pytest.mark.deepspeed,
              pytest.mark.skipif(os.environ.get("RHYMECTL_SOAK") != "1",
                                 reason="opt-in: RHYMECTL_SOAK=1 (hours on 2 cores)")]

STEPS = int(os.environ.get("RHYMECTL_SOAK_STEPS", "500"))


def test_soak_memory_flat_index_bounded_step_time_steady(tiny_model, tmp_path):
    out = tmp_path / "soak"
    proc = subprocess.run([sys.executable, str(REPO / "scripts/soak.py"), "--model",
                           str(tiny_model), "--steps", str(STEPS), "--out", str(out)],
                          capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((out / "soak.json").read_text())["summary"]
    assert summary["steps_run"] == STEPS
    assert summary["rss_growth_mib_per_100_steps"] < 20.0, summary
    assert summary["index"]["within_bound"], summary
    assert abs(summary["step_time_drift_s_per_100_steps"]) < 0.2 * summary["step_time_s_mean"], summary
    assert (out / "soak.png").is_file()
