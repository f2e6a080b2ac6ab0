"""Run-directory guards and checkpoint bookkeeping (no engines)."""

from __future__ import annotations

import json
import random
from dataclasses import replace

import pytest
import torch

from pipeline.config import load_config, to_yaml
from pipeline.errors import UsageError
from pipeline.loop import rundir
from pipeline.loop.batches import PromptSource, shard
from pipeline.train import checkpoint


@pytest.fixture
def model_dir(tmp_path):
    d = tmp_path / "model"
    d.mkdir()
    (d / "config.json").write_text('{"max_position_embeddings": 256}')
    (d / "tokenizer.json").write_text("{}")
    (d / "model.safetensors").write_bytes(b"x" * 10)
    return d


def cfg_for(tmp_path, model_dir, *extra):
    return load_config(None, [f"run.dir={tmp_path / 'run'}", f"model.path={model_dir}", *extra])


def test_a_new_run_dir_is_accepted_and_resume_of_nothing_starts_the_run(tmp_path, model_dir,
                                                                         capsys):
    """A job script that always passes --resume (a Slurm requeue) must work when the first
    attempt was killed before it wrote anything."""
    cfg = cfg_for(tmp_path, model_dir)
    rundir.check_run_dir(cfg, resume=False, force=False)
    rundir.check_run_dir(cfg, resume=True, force=False)
    d = rundir.start(cfg, resume=True, force=False)
    assert "--resume: " in capsys.readouterr().err
    assert json.loads((d / "run.json").read_text()) == rundir.identity(cfg)
    assert (d / "config.yaml").read_text() == to_yaml(cfg)
    with pytest.raises(UsageError, match="already holds a run"):
        rundir.check_run_dir(cfg, resume=False, force=False)


def test_a_start_killed_between_its_two_writes_resumes_and_writes_the_config(tmp_path, model_dir,
                                                                             capsys):
    cfg = cfg_for(tmp_path, model_dir)
    d = rundir.start(cfg, resume=False, force=False)
    (d / "config.yaml").unlink()  # run.json is written first
    rundir.check_run_dir(cfg, resume=True, force=False)
    rundir.start(cfg, resume=True, force=False)
    assert (d / "config.yaml").read_text() == to_yaml(cfg)
    assert "note" not in capsys.readouterr().err  # a run existed: a plain resume
    identity = (d / "run.json").read_text()
    rundir.start(cfg, resume=True, force=False)  # a resume of a complete run rewrites nothing
    assert (d / "run.json").read_text() == identity


def test_an_existing_run_needs_resume_or_force(tmp_path, model_dir):
    cfg = cfg_for(tmp_path, model_dir)
    rundir.start(cfg, resume=False, force=False)
    with pytest.raises(UsageError, match="already holds a run; pass --resume to continue it or --force"):
        rundir.check_run_dir(cfg, resume=False, force=False)
    rundir.check_run_dir(cfg, resume=True, force=False)
    rundir.check_run_dir(cfg, resume=False, force=True)
    # total_steps may change on resume: it is not part of the run's identity
    rundir.check_run_dir(replace(cfg, train=replace(cfg.train, total_steps=99)), resume=True, force=False)


def test_resume_with_another_config_or_model_is_refused_naming_both_fingerprints(tmp_path, model_dir):
    cfg = cfg_for(tmp_path, model_dir)
    rundir.start(cfg, resume=False, force=False)
    other = cfg_for(tmp_path, model_dir, "rollout.temperature=0.7")
    with pytest.raises(UsageError) as info:
        rundir.check_run_dir(other, resume=True, force=False)
    old, new = rundir.config_fingerprint(cfg), rundir.config_fingerprint(other)
    assert f"written with another config (fingerprint {old}, this one {new})" in str(info.value)
    (model_dir / "model.safetensors").write_bytes(b"y" * 11)  # different weights
    with pytest.raises(UsageError, match="written with another model"):
        rundir.check_run_dir(cfg, resume=True, force=False)


def test_a_foreign_non_empty_directory_is_never_touched(tmp_path, model_dir):
    cfg = cfg_for(tmp_path, model_dir)
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "notes.txt").write_text("mine")
    for resume, force in ((False, False), (False, True), (True, False)):
        with pytest.raises(UsageError, match="is not empty and holds no rhymectl run"):
            rundir.check_run_dir(cfg, resume=resume, force=force)
    assert (tmp_path / "run" / "notes.txt").read_text() == "mine"


def test_force_clears_only_rhymectl_entries(tmp_path, model_dir):
    cfg = cfg_for(tmp_path, model_dir)
    d = rundir.start(cfg, resume=False, force=False)
    (d / "history").mkdir()
    (d / "metrics.jsonl").write_text("{}\n")
    (d / "keep.txt").write_text("user file")
    rundir.start(cfg, resume=False, force=True)
    assert not (d / "history").exists() and not (d / "metrics.jsonl").exists()
    assert (d / "keep.txt").read_text() == "user file"
    assert json.loads((d / "run.json").read_text())["config"] == rundir.config_fingerprint(cfg)


def test_only_complete_checkpoints_count(tmp_path):
    root = tmp_path / "checkpoints"
    assert checkpoint.latest(root) is None
    for step in (2, 4):
        checkpoint.prepare(root, step)
        checkpoint.commit(root, step, {"step": step}, tmp_path, keep=5)
    checkpoint.prepare(root, 6)  # a crash before commit: only the temp folder exists
    (root / "step-000008").mkdir()  # a folder without state.json is not a checkpoint
    assert checkpoint.latest(root).name == "step-000004"
    checkpoint.commit(root, 6, {"step": 6}, tmp_path, keep=2)
    assert sorted(p.name for p in root.glob("step-*") if (p / "state.json").exists()) == \
        ["step-000004", "step-000006"]
    assert checkpoint.read_state(checkpoint.latest(root)) == {"step": 6, "files": {}}


def test_rng_state_round_trips_through_safetensors(tmp_path):
    torch.manual_seed(1)
    random.seed(2)
    checkpoint.save_rng(tmp_path, rank=0)
    expected = (torch.rand(3), random.random())
    torch.manual_seed(99)
    random.seed(99)
    checkpoint.load_rng(tmp_path, rank=0)
    assert torch.equal(torch.rand(3), expected[0]) and random.random() == expected[1]


def test_batches_are_a_pure_function_of_seed_and_step():
    rows = [{"id": f"p{i}", "prompt": f"sort {i}:", "answer": str(i)} for i in range(10)]
    rows.append(dict(rows[0]))  # a repeated prompt is one prompt
    src = PromptSource(rows, batch_size=3, seed=5)
    assert src.steps_per_epoch == 3
    again = PromptSource(rows, batch_size=3, seed=5)
    assert [p.id for p in src.batch(4)] == [p.id for p in again.batch(4)]
    epoch0 = [p.id for s in range(3) for p in src.batch(s)]
    assert len(set(epoch0)) == 9  # no prompt twice within an epoch
    assert epoch0 != [p.id for s in range(3, 6) for p in src.batch(s)]  # reshuffled per epoch
    assert [p.id for p in shard(src.batch(0), 1, 3)] == [src.batch(0)[1].id]
    with pytest.raises(UsageError, match="fewer than data.train_batch_size = 20"):
        PromptSource(rows, batch_size=20, seed=0)


def test_resume_with_a_changed_data_file_is_refused(tmp_path, model_dir):
    """Batches are a function of (seed, step) over the data set's prompts: a resume on an
    edited data file would silently train on other prompts than the run's first steps."""
    data = tmp_path / "train.jsonl"
    data.write_text('{"prompt": "sort 21:", "answer": "12"}\n')
    cfg = cfg_for(tmp_path, model_dir, f"data.path={data}", "data.task=null")
    d = rundir.start(cfg, resume=False, force=False)
    rundir.check_run_dir(cfg, resume=True, force=False)  # unchanged
    before = rundir.data_fingerprint(cfg)
    data.write_text('{"prompt": "sort 31:", "answer": "13"}\n')
    with pytest.raises(UsageError) as info:
        rundir.check_run_dir(cfg, resume=True, force=False)
    assert (f"written with another data set (fingerprint {before}, this one "
            f"{rundir.data_fingerprint(cfg)}); restore data.path = {data} as the run read it or "
            f"a new run.dir") in str(info.value)
    # a run written before the data fingerprint existed still resumes
    identity = json.loads((d / "run.json").read_text())
    del identity["data"]
    (d / "run.json").write_text(json.dumps(identity))
    rundir.check_run_dir(cfg, resume=True, force=False)


def test_the_built_in_task_has_no_data_fingerprint(tmp_path, model_dir):
    assert rundir.data_fingerprint(cfg_for(tmp_path, model_dir)) is None
