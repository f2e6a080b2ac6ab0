"""scripts/gpu_check.sh --smoke: the GPU check's whole path (DeepSpeed ZeRO-3 Actor with the
reference model, one GRPO update, streamed weights, checkpoint and export) on a tiny model
on the CPU, so the script runs wherever the tests do and does not rot between GPU runs."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
VERDICT = re.compile(r"^(PASS|FAIL|SKIP) ([a-z_]+): (.+)$")

pytestmark = pytest.mark.deepspeed

EXPECTED = [("PASS", "environment"), ("PASS", "deepspeed"), ("PASS", "model"),
            ("PASS", "build"), ("PASS", "update"), ("PASS", "devices"),
            ("PASS", "named_weights"), ("PASS", "checkpoint"),
            ("SKIP", "memory"), ("SKIP", "wall_time")]


def test_smoke_run_passes_every_check_a_cpu_can_make():
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}  # the CPU path, also on a GPU machine
    proc = subprocess.run([str(REPO / "scripts/gpu_check.sh"), "--smoke"], capture_output=True,
                          text=True, cwd=REPO, env=env, timeout=600)
    lines = proc.stdout.splitlines()
    parsed = [VERDICT.match(line) for line in lines]
    assert all(parsed), f"stdout holds only verdict lines, got: {lines}"
    assert [(m[1], m[2]) for m in parsed] == EXPECTED, proc.stdout + proc.stderr[-3000:]
    assert proc.returncode == 0, proc.stderr[-3000:]
    details = {m[2]: m[3] for m in parsed}
    assert "ZeRO-3" in details["build"] and "reference model" in details["build"]
    assert "changed" in details["update"]
    assert "torch.bfloat16" in details["named_weights"]
    assert "every tensor equal" in details["checkpoint"]
    assert details["memory"].startswith("no CUDA device")


def test_a_bad_wheel_path_is_one_line_and_exit_2():
    proc = subprocess.run([str(REPO / "scripts/gpu_check.sh"), "--smoke", "--deepspeed-wheel",
                           "no/such/wheel.whl"], capture_output=True, text=True, cwd=REPO,
                          timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1] == (
        "scripts/gpu_check.sh: error: --deepspeed-wheel no/such/wheel.whl does not exist; give a .whl "
        "file or a folder of them")
