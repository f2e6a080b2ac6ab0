"""`bench spec` reuses a training run only when it is the same run, `spec` aside."""

from __future__ import annotations

import json

import pytest

from pipeline.bench.spec_plan import Plan, _check_same_run
from pipeline.config import load_config, to_yaml
from pipeline.errors import UsageError
from pipeline.loop.rundir import config_fingerprint


def write_run(run_dir, cfg) -> None:
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text(to_yaml(cfg))
    (run_dir / "run.json").write_text(json.dumps({"config": config_fingerprint(cfg)}))


def plan(run_dir, *overrides) -> Plan:
    return Plan(load_config(None, list(overrides)), run_dir, 3, 2)


def test_a_run_that_differs_only_in_spec_is_reused(tmp_path):
    run = tmp_path / "run"
    write_run(run, load_config(None, ["spec.method=history+group", "spec.budget=throughput"]))
    _check_same_run(plan(run, "spec.method=none", "spec.budget=tree",
                         "spec.num_speculative_tokens=16"))  # no error


def test_a_run_with_other_training_settings_is_refused(tmp_path):
    run = tmp_path / "run"
    write_run(run, load_config(None, ["spec.budget=throughput"]))
    with pytest.raises(UsageError, match="holds a run with another config"):
        _check_same_run(plan(run, "spec.budget=tree", "data.train_size=64"))


def test_an_unreadable_run_config_is_another_config(tmp_path):
    run = tmp_path / "run"
    write_run(run, load_config(None, ["spec.budget=throughput"]))
    (run / "config.yaml").write_text("data: [unclosed")
    with pytest.raises(UsageError, match="holds a run with another config"):
        _check_same_run(plan(run, "spec.budget=tree"))
