"""The claims of docs/security.md that a test can hold: no object-constructing YAML, no
'..' in run.dir, trust_remote_code only from its config key, no pickle in the library,
ids never become paths, JSON only in the coordination store."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.config import load_config
from pipeline.errors import UsageError

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "sample_configs/tiny.yaml"


def _sources(*roots: str):
    for root in roots:
        yield from sorted((REPO / root).rglob("*.py"))


def rhymectl(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rhymectl", *args], capture_output=True,
                          text=True, cwd=cwd, timeout=120, env={"PYTHONPATH": str(REPO),
                                                               "PATH": os.defpath})


def test_yaml_object_tags_are_refused(tmp_path):
    marker = tmp_path / "ran"
    bad = tmp_path / "bad.yaml"
    bad.write_text(f"run:\n  dir: !!python/object/apply:os.system ['touch {marker}']\n")
    proc = rhymectl("train", str(bad), "--dry-run")
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("error: ") and len(proc.stderr.strip().splitlines()) == 1
    assert "python/object/apply" in proc.stderr
    assert not marker.exists()


def test_yaml_tag_in_an_override_is_refused(tmp_path):
    marker = tmp_path / "ran"
    with pytest.raises(UsageError):
        load_config(TINY, [f"run.seed=!!python/object/apply:os.system ['touch {marker}']"])
    assert not marker.exists()


@pytest.mark.parametrize("value", ["../elsewhere", "runs/../../etc", "runs/..", " "])
def test_run_dir_with_dotdot_is_refused(value):
    with pytest.raises(UsageError, match="run.dir"):
        load_config(TINY, [f"run.dir={value}"])


def test_trust_remote_code_is_off_unless_the_config_key_sets_it():
    assert load_config(TINY).model.trust_remote_code is False
    assert load_config(TINY, ["model.trust_remote_code=true"]).model.trust_remote_code is True
    offenders = []
    for path in _sources("pipeline", "rhymectl"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.keyword) and node.arg == "trust_remote_code":
                if not (isinstance(node.value, ast.Attribute) and node.value.attr == "trust_remote_code"):
                    offenders.append(f"{path.relative_to(REPO)}:{node.value.lineno}")
    assert offenders == []  # every use passes the config key through, never a literal


def test_no_pickle_in_the_library():
    """Nothing the library reads back is unpickled by its own code (DeepSpeed's `ds/`
    state is the documented exception, inside deepspeed)."""
    offenders = []
    for path in _sources("pipeline", "rhymectl"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            elif isinstance(node, ast.Attribute) and node.attr == "load" and \
                    isinstance(node.value, ast.Name) and node.value.id == "torch":
                names = ["torch.load"]
            if any(n.split(".")[0] in ("pickle", "dill", "cloudpickle", "joblib", "shelve")
                   or n == "torch.load" for n in names):
                offenders.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert offenders == []


def test_the_coordination_store_carries_json_only():
    """Every value the scheduler puts in the TCPStore is json.dumps(...) or a counter."""
    tree = ast.parse((REPO / "pipeline/loop/sched_runtime.py").read_text())
    sets = [n for n in ast.walk(tree) if isinstance(n, ast.Call)
            and isinstance(n.func, ast.Attribute) and n.func.attr == "set"]
    assert sets
    for call in sets:
        value = call.args[1]
        ok = (isinstance(value, ast.Constant) and isinstance(value.value, str)) or (
            isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute)
            and value.func.attr == "dumps" and getattr(value.func.value, "id", "") == "json")
        assert ok, f"runtime.py:{call.lineno} stores something other than JSON"


def test_prompt_ids_never_become_paths(tmp_path):
    from pipeline.history.store import HistoryStore, RolloutRecord

    run = tmp_path / "run"
    store = HistoryStore(run)
    evil = ["../../escaped", "/etc/passwd", "a/../../b"]
    store.append(0, [RolloutRecord(pid, "h", 0, 0, 0, 0, [1], 1, "stop", 1.0, 0.0) for pid in evil])
    written = {str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file()}
    assert written == {"run/history/step-000000.parquet"}
    assert [r.prompt_id for r in store.read_step(0)] == evil
