"""The `rhymectl` command line: help, exit codes and the exact error text of every path.

The CLI runs in-process (`rhymectl.app.main`) with stdout/stderr captured; two tests run the
real console script. Nothing here starts vLLM, DeepSpeed or training: `train --dry-run`
stops after preflight. Exit codes: 0 success, 1 runtime failure, 2 usage error.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import typer
import yaml

from pipeline.errors import RuntimeFailure, UsageError
from rhymectl.app import app, main

ROOT = Path(__file__).resolve().parents[2]
TINY = str(ROOT / "sample_configs" / "tiny.yaml")
CONFIG_JSON = json.dumps({"max_position_embeddings": 256})


@pytest.fixture(autouse=True)
def _isolated(tmp_path, monkeypatch):
    """Run in an empty folder; undo the RHYMECTL_DEBUG that `--debug` exports."""
    monkeypatch.setenv("RHYMECTL_DEBUG", "0")
    monkeypatch.chdir(tmp_path)


def cli(capsys, *args) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of `rhymectl ARGS`, run in-process."""
    with pytest.raises(SystemExit) as info:
        main([str(a) for a in args])
    out, err = capsys.readouterr()
    code = info.value.code
    return (0 if code is None else code), out, err


def fails(capsys, *args, code: int = 2) -> str:
    """The one error line (without 'error: ') of a command that must fail with `code`."""
    got, out, err = cli(capsys, *args)
    assert got == code, err
    assert out == ""
    assert err.startswith("error: ") and err.endswith("\n")
    assert err.count("\n") == 1, f"more than one line on stderr:\n{err}"
    return err[len("error: "):-1]


def dry_run(capsys, *overrides, **kw) -> str:
    return fails(capsys, "train", TINY, *overrides, "--dry-run", **kw)


def problems(capsys, *overrides) -> list[str]:
    """Every problem a failing `train --dry-run` reports (preflight reports them all: one
    line alone, or a 'config has N problems:' head and one indented line each)."""
    got, out, err = cli(capsys, "train", TINY, *overrides, "--dry-run")
    assert got == 2 and out == "" and err.startswith("error: "), err
    lines = err[len("error: "):].rstrip("\n").split("\n")
    if len(lines) == 1:
        return lines
    assert lines[0] == f"config has {len(lines) - 1} problems:", err
    return [line.removeprefix("  ") for line in lines[1:]]


@pytest.fixture
def fake_model(tmp_path) -> Path:
    """Passes the model-directory check; its tokenizer does not load (data checks come first)."""
    d = tmp_path / "fake-model"
    d.mkdir()
    (d / "config.json").write_text(CONFIG_JSON)
    (d / "model.safetensors").write_bytes(b"")
    (d / "tokenizer.json").write_text("{}")
    return d


@pytest.fixture(scope="session")
def real_model(tmp_path_factory) -> Path:
    """A directory whose char tokenizer loads: enough for a dry-run to pass (no weights are read)."""
    from pipeline.policy.tokenizer import train_char_tokenizer

    d = tmp_path_factory.mktemp("real-model")
    train_char_tokenizer(["sort 0123456789:"]).save_pretrained(d)
    (d / "config.json").write_text(CONFIG_JSON)
    (d / "model.safetensors").write_bytes(b"")
    return d


def write_jsonl(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path.name


# -- help -------------------------------------------------------------------------------


def _command_paths(typer_app, prefix=()):
    for info in typer_app.registered_commands:
        name = info.name or info.callback.__name__.replace("_", "-")
        yield prefix + (name,)
    for group in typer_app.registered_groups:
        name = group.name or group.typer_instance.info.name
        yield prefix + (name,)
        yield from _command_paths(group.typer_instance, prefix + (name,))


COMMANDS = [()] + list(_command_paths(app))


def test_the_meta_test_sees_every_command():
    assert {"train", "init-model", "doctor"} <= {p[-1] for p in COMMANDS if p}


@pytest.mark.parametrize("path", COMMANDS, ids=lambda p: " ".join(p) or "rhymectl")
@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_every_command_has_help_with_an_example(capsys, path, flag):
    code, out, err = cli(capsys, *path, flag)
    assert code == 0, err
    assert "Usage: rhymectl" in out
    assert "Example" in out
    assert err == ""


def test_no_arguments_show_the_help_and_exit_2(capsys):
    code, out, err = cli(capsys)
    assert code == 2
    assert "Usage: rhymectl [OPTIONS] COMMAND [ARGS]..." in out
    assert err == ""


# -- command-line use -------------------------------------------------------------------


def test_an_unknown_command(capsys):
    assert fails(capsys, "frobnicate") == "No such command 'frobnicate'. (see `rhymectl --help`)"


def test_an_unknown_option(capsys):
    assert fails(capsys, "train", TINY, "--bogus") == (
        "No such option: --bogus (see `rhymectl train --help`)")
    assert fails(capsys, "train", TINY, "--dry-rn") == (
        "No such option: --dry-rn (Possible options: --dry-run) (see `rhymectl train --help`)")


def test_a_missing_argument(capsys):
    assert fails(capsys, "train") == "Missing argument 'config'. (see `rhymectl train --help`)"
    assert fails(capsys, "bench", "sched", "--workers", "0") == (
        "Invalid value for '--workers': Input should be greater than or equal to 1 (see "
        "`rhymectl bench sched --help`)")
    assert fails(capsys, "bench", "nope").startswith("No such command 'nope'.")
    assert fails(capsys, "bench", "nope").endswith("(see `rhymectl bench --help`)")


def test_nproc_below_one(capsys):
    assert fails(capsys, "train", TINY, "--nproc", "0", "--dry-run").startswith(
        "Invalid value for '--nproc': ")


# -- config errors ----------------------------------------------------------------------


def test_acceptance_a_misspelt_override_names_the_key_and_suggests_the_right_one(capsys):
    """Acceptance: `train sample_configs/tiny.yaml rollout.nn=4 --dry-run` exits 2 naming
    rollout.nn and suggesting rollout.n."""
    message = dry_run(capsys, "rollout.nn=4")
    assert "rollout.nn" in message and "did you mean rollout.n?" in message
    assert message == "unknown key rollout.nn in rollout; did you mean rollout.n?"


def test_a_config_problem_stops_before_any_other_check(capsys):
    # --nproc 3 would fail preflight; the config is checked first.
    assert dry_run(capsys, "rollout.n=1", "--nproc", "3") == (
        "rollout.n = 1 is not allowed; expected an integer >= 2 (GRPO needs a group)")


def test_every_config_problem_is_shown_at_once(capsys):
    code, out, err = cli(capsys, "train", TINY, "rollout.n=1", "spec.method=fast", "--dry-run")
    assert (code, out) == (2, "")
    assert err == (
        "error: config has 2 problems:\n"
        "  rollout.n = 1 is not allowed; expected an integer >= 2 (GRPO needs a group)\n"
        "  spec.method = 'fast' is not allowed; expected one of none, ngram, suffix, history, "
        "group, history+group, history+group+model\n")


def test_an_override_without_equals(capsys):
    assert dry_run(capsys, "rollout.n") == "override 'rollout.n' is not key=value; write e.g. rollout.n=8"


def test_a_missing_config_file(capsys):
    assert fails(capsys, "train", "nope.yaml", "--dry-run") == (
        "config file nope.yaml does not exist; pass the path of a YAML file (see sample_configs/)")


def test_a_malformed_config_file(capsys, tmp_path):
    (tmp_path / "bad.yaml").write_text("data:\n  task: sort\n   path: x\n")
    assert fails(capsys, "train", "bad.yaml", "--dry-run") == (
        "config file bad.yaml is not valid YAML at line 3, column 8: mapping values are not allowed here")


def test_a_config_file_that_is_a_list(capsys, tmp_path):
    (tmp_path / "list.yaml").write_text("- data\n- model\n")
    assert fails(capsys, "train", "list.yaml", "--dry-run") == (
        "config file list.yaml must hold a mapping of sections (data:, model:, rollout:, ...), not a list")


# -- preflight: world size and model directory ------------------------------------------


def test_a_batch_that_does_not_divide_over_the_ranks(capsys):
    assert ("data.train_batch_size = 16 does not divide over 3 ranks; make it a multiple of 3 or "
            "change --nproc") in problems(capsys, "--nproc", "3")
    assert ("train.ppo_mini_batch_size = 8 does not divide over 16 ranks; make it a multiple of "
            "16 or change --nproc") in problems(capsys, "data.train_batch_size=32", "--nproc", "16")


def test_tail_batching_needs_the_static_split_and_no_tensor_parallelism(capsys):
    tail = "sched.tail_batching.overprovision=0.25"
    assert ("sched.tail_batching runs each rollout worker's own share (the static split); with 2 "
            "workers set sched.policy: static, or sched.tail_batching.overprovision: 0 to keep "
            "sched.policy: seer") in problems(capsys, tail, "--nproc", "2")
    assert not [p for p in problems(capsys, tail, "sched.policy=static", "model.path=models/none",
                                    "--nproc", "2") if "tail_batching" in p]
    assert ("sched.tail_batching does not run with rollout.tensor_parallel_size > 1 yet; set one "
            "of them back (overprovision: 0 or tensor_parallel_size: 1)") in problems(
        capsys, tail, "rollout.tensor_parallel_size=2", "--nproc", "2")


def test_preflight_reports_every_problem_at_once(capsys):
    assert problems(capsys, "model.path=models/none", "data.train_batch_size=10",
                    "train.ppo_mini_batch_size=5", "--nproc", "4") == [
        "data.train_batch_size = 10 does not divide over 4 ranks; make it a multiple of 4 or "
        "change --nproc",
        "train.ppo_mini_batch_size = 5 does not divide over 4 ranks; make it a multiple of 4 or "
        "change --nproc",
        "model.path = models/none does not exist; run `rhymectl init-model --out models/none` "
        "or point model.path at a local Hugging-Face model directory"]


def test_a_model_directory_that_does_not_exist(capsys):
    message = dry_run(capsys, "model.path=models/none")
    assert message == (
        "model.path = models/none does not exist; run `rhymectl init-model --out models/none` "
        "or point model.path at a local Hugging-Face model directory")


def test_the_sample_config_without_init_model_points_at_init_model(capsys):
    assert "run `rhymectl init-model --out models/tiny-sort`" in dry_run(capsys)


def test_a_model_directory_without_weights(capsys, tmp_path):
    d = tmp_path / "no-weights"
    d.mkdir()
    (d / "config.json").write_text(CONFIG_JSON)
    (d / "tokenizer.json").write_text("{}")
    assert dry_run(capsys, "model.path=no-weights") == (
        "model.path = no-weights has no weights (model.safetensors); point model.path at a "
        "complete Hugging-Face model directory")
    (d / "rhymectl_model.json").write_text('{"task": "sort", "seed": 0}')  # init-model built it
    assert dry_run(capsys, "model.path=no-weights") == (
        "model.path = no-weights has no weights (model.safetensors); rebuild it with "
        "`rhymectl init-model --out no-weights --force` or point model.path elsewhere")


def test_an_empty_model_directory_lists_everything_missing(capsys, tmp_path):
    (tmp_path / "empty").mkdir()
    assert dry_run(capsys, "model.path=empty") == (
        "model.path = empty has no config.json, no weights (model.safetensors), no tokenizer "
        "(tokenizer.json); rebuild it with `rhymectl init-model --out empty --force` or point "
        "model.path elsewhere")


def test_a_model_path_that_is_a_file(capsys, tmp_path):
    (tmp_path / "model.bin").write_bytes(b"")
    assert dry_run(capsys, "model.path=model.bin") == (
        "model.path = model.bin is a file; it must be a model directory")


def test_a_tokenizer_that_does_not_load(capsys, fake_model):
    message = dry_run(capsys, f"model.path={fake_model}")
    assert message.startswith(f"the tokenizer in {fake_model} does not load (")
    assert message.endswith("); point model.path at a complete Hugging-Face model directory")


# -- preflight: data set and reward -----------------------------------------------------


def test_a_data_path_that_does_not_exist(capsys, fake_model):
    assert dry_run(capsys, f"model.path={fake_model}", "data.path=missing.jsonl") == (
        "data.path 'missing.jsonl' does not exist; check data.path")


def test_a_data_set_without_the_prompt_column(capsys, tmp_path, fake_model):
    name = write_jsonl(tmp_path / "q.jsonl", [{"question": "sort 21:", "answer": "12"}])
    assert dry_run(capsys, f"model.path={fake_model}", f"data.path={name}") == (
        "data set 'q.jsonl' has no prompt column 'prompt' (columns: question, answer); "
        "set data.prompt_key")


def test_a_data_set_without_the_answer_column(capsys, tmp_path, fake_model):
    name = write_jsonl(tmp_path / "a.jsonl", [{"prompt": "sort 21:", "label": "12"}])
    assert dry_run(capsys, f"model.path={fake_model}", f"data.path={name}") == (
        "data set 'a.jsonl' has no answer column 'answer' (columns: prompt, label); "
        "set data.answer_key")


def test_a_data_set_with_empty_prompts(capsys, tmp_path, fake_model):
    name = write_jsonl(tmp_path / "e.jsonl", [{"prompt": "sort 21:", "answer": "12"},
                                               {"prompt": "  ", "answer": "1"},
                                               {"prompt": None, "answer": "1"}])
    assert dry_run(capsys, f"model.path={fake_model}", f"data.path={name}") == (
        "2 of 3 rows of 'e.jsonl' have an empty prompt (first at row 1); remove them or set "
        "data.prompt_key")


def test_an_empty_data_set(capsys, tmp_path, fake_model):
    (tmp_path / "none.jsonl").write_text("\n")
    assert dry_run(capsys, f"model.path={fake_model}", "data.path=none.jsonl") == (
        "data set 'none.jsonl' has no rows; point data.path at a non-empty data set")


def test_a_data_set_with_a_bad_json_line(capsys, tmp_path, fake_model):
    (tmp_path / "bad.jsonl").write_text('{"prompt": "sort 1:", "answer": "1"}\n{oops\n')
    assert dry_run(capsys, f"model.path={fake_model}", "data.path=bad.jsonl") == (
        "line 2 of 'bad.jsonl' is not valid JSON (Expecting property name enclosed in double "
        "quotes); fix the file")


def test_a_data_set_with_an_unsupported_extension(capsys, tmp_path, fake_model):
    (tmp_path / "d.csv").write_text("prompt,answer\nsort 1:,1\n")
    assert dry_run(capsys, f"model.path={fake_model}", "data.path=d.csv") == (
        "data.path 'd.csv' has unsupported extension '.csv'; use one of .jsonl, .json, .parquet "
        "or a folder written by save_to_disk")


def test_an_unknown_task_gets_a_did_you_mean(capsys, fake_model):
    assert ("unknown task 'srot'; did you mean 'sort'? valid tasks: reverse, sort"
            in problems(capsys, f"model.path={fake_model}", "data.task=srot"))


@pytest.mark.parametrize("reward, message", [
    ("nope", "unknown reward 'nope'; use a built-in reward (gsm8k, math), a built-in task "
             "(reverse, sort) or module:function"),
    ("sortt", "unknown reward 'sortt'; did you mean 'sort'? use a built-in reward (gsm8k, math), "
              "a built-in task (reverse, sort) or module:function"),
    ("gsm8", "unknown reward 'gsm8'; did you mean 'gsm8k'? use a built-in reward (gsm8k, math), "
             "a built-in task (reverse, sort) or module:function"),
    ("no_such_pkg:score", "cannot import module 'no_such_pkg' for reward 'no_such_pkg:score' "
                          "(ModuleNotFoundError: No module named 'no_such_pkg'); check the name "
                          "and that it is on PYTHONPATH"),
    ("json:no_such_fn", "module 'json' has no attribute 'no_such_fn'; check reward 'json:no_such_fn'"),
    (":score", "reward ':score' is not module:function; write it like my_pkg.rewards:score"),
])
def test_an_unknown_reward(capsys, fake_model, reward, message):
    assert message in problems(capsys, f"model.path={fake_model}", f"data.reward={reward}")


def test_a_user_data_set_needs_a_reward(capsys, tmp_path, fake_model):
    name = write_jsonl(tmp_path / "ok.jsonl", [{"prompt": "sort 21:", "answer": "12"}])
    assert ("data.reward is not set; name a built-in reward (gsm8k, math), a built-in task's "
            "reward (sort, reverse) or a module:function(prompt, response, answer) -> float") in problems(
        capsys, f"model.path={fake_model}", f"data.path={name}", "data.task=null")


# -- preflight: lengths (a tokenizer that loads) ----------------------------------------


@pytest.fixture
def prompts16(tmp_path) -> str:
    """A data set of 16 distinct prompts: TINY's data.train_batch_size. "sort 21:" is 8
    characters; the char tokenizer adds BOS: 9 tokens each."""
    rows = [{"prompt": f"sort {n}:", "answer": "".join(sorted(str(n)))} for n in range(10, 26)]
    return write_jsonl(tmp_path / "prompts16.jsonl", rows)


def test_a_prompt_longer_than_max_prompt_length(capsys, real_model, prompts16):
    assert dry_run(capsys, f"model.path={real_model}", f"data.path={prompts16}",
                   "data.max_prompt_length=8") == (
        "the longest prompt has 9 tokens, more than data.max_prompt_length = 8; raise it or "
        "filter the data set")


def test_prompt_and_response_longer_than_the_context(capsys, real_model, prompts16):
    assert dry_run(capsys, f"model.path={real_model}", f"data.path={prompts16}",
                   "rollout.max_tokens=225") == (
        "data.max_prompt_length + rollout.max_tokens = 257 exceeds the model's context of 256 "
        "tokens; lower rollout.max_tokens")


def test_a_draft_warm_up_the_data_cannot_give_fails_the_dry_run(capsys, real_model, prompts16):
    model = (f"model.path={real_model}", f"data.path={prompts16}",
             "spec.method=history+group+model")
    assert dry_run(capsys, *model, "spec.draft_warmup=eval") == (
        "spec.draft_warmup = eval learns from the held-out evaluation before step 1, and this "
        "run has none (data.eval_path unset or data.eval_size 0): give it one, or use "
        "spec.draft_warmup=rollout")
    assert dry_run(capsys, *model, "data.train_size=12", "spec.draft_warmup=rollout",
                   "spec.draft_warmup_prompts=8", "data.train_batch_size=4",
                   "train.ppo_mini_batch_size=4") == (
        "spec.draft_warmup_prompts = 8: the data set has 16 rows, 12 of them trained on: ask "
        "for at most 4 warm-up prompts (spec.draft_warmup_prompts), or train on fewer "
        "(data.train_size)")


def test_a_draft_model_the_policy_cannot_hold_fails_the_dry_run(capsys, tmp_path, real_model,
                                                                prompts16):
    """Its layers must fit in 10 % of the policy's parameters: said in one line before any
    engine starts (it used to pass the dry run and stop the engine with a traceback)."""
    import shutil

    from tests.unit.test_draft_model import TINY_POLICY

    def policy(**changes) -> tuple[str, ...]:
        d = tmp_path / f"policy-{len(list(tmp_path.iterdir()))}"
        shutil.copytree(real_model, d)
        (d / "config.json").write_text(json.dumps({**TINY_POLICY, **changes}))
        return (f"model.path={d}", f"data.path={prompts16}", "spec.method=history+group+model")

    tiny = policy()
    assert dry_run(capsys, *tiny, "spec.draft_layers=2") == (
        "spec.draft_layers = 2: 2 decoder layer(s) of the policy's width (128) do not fit in "
        "10 % of its 1,062,656 parameters, the draft model's bound; lower spec.draft_layers "
        "to 1")
    # with the draft on the GPU the memory plan, which counts it, leaves the saying to this
    # check (it used to stop the dry run with shape_for's ValueError)
    assert dry_run(capsys, *tiny, "spec.draft_layers=2", "spec.draft_device=auto",
                   "--gpu-mem-gib", "80").startswith("spec.draft_layers = 2: 2 decoder layer(s)")
    assert cli(capsys, "train", TINY, *tiny, "--dry-run")[0] == 0  # one layer fits
    assert dry_run(capsys, *policy(num_hidden_layers=1)) == (
        "spec.draft_layers = 1: 1 decoder layer(s) of the policy's width (128) do not fit in "
        "10 % of its 275,456 parameters, the draft model's bound; use a method without a "
        "draft model (history+group)")


def test_a_dry_run_that_passes_prints_the_config_and_the_checks(capsys, tmp_path, real_model,
                                                                prompts16):
    before = sorted(p.name for p in tmp_path.iterdir())
    code, out, err = cli(capsys, "train", TINY, f"model.path={real_model}", f"data.path={prompts16}",
                         "rollout.max_tokens=224", "--dry-run")
    assert (code, err) == (0, "")
    assert out.endswith("# checks passed: world_size=1, prompts=16, longest_prompt_tokens=9, "
                        "model_context=256, reward=sort\n")
    printed = yaml.safe_load(out)
    assert printed["model"]["path"] == str(real_model)
    assert printed["data"]["path"] == prompts16 and printed["rollout"]["max_tokens"] == 224
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # a dry run writes nothing


def test_a_dry_run_with_json_prints_one_object(capsys, real_model, prompts16):
    code, out, err = cli(capsys, "train", TINY, f"model.path={real_model}", f"data.path={prompts16}",
                         "--dry-run", "--json", "--nproc", "2")
    assert (code, err) == (0, "")
    report = json.loads(out)
    assert report["checks"] == {"world_size": 2, "prompts": 16, "longest_prompt_tokens": 9,
                                "model_context": 256, "reward": "sort"}
    assert report["config"]["rollout"]["n"] == 8 and report["config"]["run"]["dir"] == "runs/tiny"


def test_run_dir_option_sets_run_dir(capsys, real_model, prompts16):
    code, out, _ = cli(capsys, "train", TINY, f"model.path={real_model}", f"data.path={prompts16}",
                       "--run-dir", "runs/exp-1", "--dry-run", "--json")
    assert code == 0 and json.loads(out)["config"]["run"]["dir"] == "runs/exp-1"


def test_run_dir_option_takes_any_path(capsys, real_model, prompts16):
    code, out, err = cli(capsys, "train", TINY, f"model.path={real_model}", f"data.path={prompts16}",
                         "--run-dir", "2024", "--dry-run", "--json")
    assert (code, err) == (0, "")
    assert json.loads(out)["config"]["run"]["dir"] == "2024"


def test_the_printed_config_keeps_square_brackets(capsys, real_model, prompts16):
    code, out, _ = cli(capsys, "train", TINY, f"model.path={real_model}", f"data.path={prompts16}",
                       "run.dir=runs/[v2]/x", "--dry-run")
    assert code == 0
    assert yaml.safe_load(out)["run"]["dir"] == "runs/[v2]/x"


def test_a_run_dir_that_cannot_be_created_fails_the_dry_run(capsys, tmp_path, real_model,
                                                          prompts16):
    (tmp_path / "notes.txt").write_text("mine")
    run_dir = tmp_path / "notes.txt" / "run"
    assert dry_run(capsys, f"model.path={real_model}", f"data.path={prompts16}",
                   f"run.dir={run_dir}") == (
        f"run.dir = {run_dir} cannot be created: {tmp_path / 'notes.txt'} is a file; choose "
        f"another run.dir")
    assert dry_run(capsys, f"model.path={real_model}", f"data.path={prompts16}",
                   f"run.dir={tmp_path / 'notes.txt'}") == (
        f"run.dir = {tmp_path / 'notes.txt'} is a file; choose a directory")


def test_the_dry_run_says_what_the_run_would_about_an_existing_run(capsys, tmp_path, real_model,
                                                                 prompts16):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "run.json").write_text("{}")
    assert dry_run(capsys, f"model.path={real_model}", f"data.path={prompts16}",
                   f"run.dir={run_dir}") == (
        f"run.dir = {run_dir} already holds a run; pass --resume to continue it or --force to "
        f"replace it")


def test_a_batch_larger_than_the_data_set_fails_the_dry_run(capsys, real_model, prompts16):
    assert dry_run(capsys, f"model.path={real_model}", f"data.path={prompts16}",
                   "data.train_batch_size=32") == (
        "the data set has 16 distinct prompts, fewer than data.train_batch_size = 32; lower it "
        "or add data")


# -- nothing written on bad input -------------------------------------------------------


@pytest.mark.parametrize("bad", [["rollout.nn=4"], ["model.path=models/none"], ["--nproc", "3"]])
def test_a_failing_dry_run_writes_nothing(capsys, tmp_path, bad):
    run_dir = tmp_path / "run"
    assert problems(capsys, f"run.dir={run_dir}", *bad)
    assert not run_dir.exists()
    assert list(tmp_path.iterdir()) == []


def test_a_failing_run_without_dry_run_writes_nothing(capsys, tmp_path):
    run_dir = tmp_path / "run"
    assert fails(capsys, "train", TINY, f"run.dir={run_dir}", "model.path=models/none").startswith(
        "model.path = models/none does not exist")
    assert list(tmp_path.iterdir()) == []


def test_a_batch_larger_than_the_data_set_writes_nothing(capsys, tmp_path, real_model,
                                                          prompts16):
    """Found in use: the run wrote run.json and config.yaml, then refused the batch, and
    the corrected command was refused as another run's config."""
    run_dir = tmp_path / "run"
    before = sorted(p.name for p in tmp_path.iterdir())
    assert fails(capsys, "train", TINY, f"run.dir={run_dir}", f"model.path={real_model}",
                 f"data.path={prompts16}", "data.train_batch_size=32") == (
        "the data set has 16 distinct prompts, fewer than data.train_batch_size = 32; lower "
        "it or add data")
    assert sorted(p.name for p in tmp_path.iterdir()) == before


# -- --debug and the mapping of failures to exit codes ----------------------------------


@pytest.mark.parametrize("where", ["first", "last"])
def test_debug_raises_a_usage_error_instead_of_the_line(capsys, where):
    args = ["train", "nope.yaml", "--dry-run"]
    args = ["--debug", *args] if where == "first" else [*args, "--debug"]
    with pytest.raises(UsageError, match="config file nope.yaml does not exist"):
        main(args)
    assert capsys.readouterr().err == ""
    assert os.environ["RHYMECTL_DEBUG"] == "1"  # exported for torchrun's children


def test_debug_raises_a_command_line_error_too(capsys):
    from rhymectl.app import click_exc

    with pytest.raises(click_exc.ClickException):
        main(["--debug", "frobnicate"])


def test_debug_from_the_environment(capsys, monkeypatch):
    monkeypatch.setenv("RHYMECTL_DEBUG", "1")
    with pytest.raises(UsageError):
        main(["train", "nope.yaml"])


def _raise(exc):
    def preflight(cfg, world_size, **_):
        raise exc
    return preflight


@pytest.mark.parametrize("exc, code, line", [
    (RuntimeError("boom"), 1, "RuntimeError: boom (rerun with --debug for the traceback)"),
    (RuntimeFailure("rollout died"), 1,
     "RuntimeFailure: rollout died (rerun with --debug for the traceback)"),
])
def test_other_failures_map_to_exit_codes(capsys, monkeypatch, exc, code, line):
    monkeypatch.setattr("pipeline.loop.preflight.preflight", _raise(exc))
    assert dry_run(capsys, code=code) == line


@pytest.mark.parametrize("exc, code, line", [
    (KeyboardInterrupt(), 130, "interrupted"),
    (typer.Exit(3), 3, None),
], ids=["ctrl-c", "typer-exit-3"])
def test_an_interrupt_or_exit_keeps_its_exit_code(capsys, monkeypatch, exc, code, line):
    monkeypatch.setattr("pipeline.loop.preflight.preflight", _raise(exc))
    got, out, err = cli(capsys, "train", TINY, "--dry-run")
    assert got == code
    if line is not None:
        assert err == f"error: {line}\n"


def test_a_crash_shows_its_traceback_with_debug(monkeypatch):
    monkeypatch.setattr("pipeline.loop.preflight.preflight", _raise(RuntimeError("boom")))
    with pytest.raises(RuntimeError, match="boom"):
        main(["train", TINY, "--dry-run", "--debug"])


# -- doctor -----------------------------------------------------------------------------


def test_doctor_json_prints_one_object(capsys):
    code, out, _ = cli(capsys, "doctor", "--json")
    assert code == 0
    report = json.loads(out)  # the whole of stdout is one JSON object
    assert isinstance(report, dict)
    assert {"torch", "vllm", "deepspeed", "arctic_inference", "device",
            "deepspeed_comm_op_built"} <= set(report)
    assert isinstance(report["deepspeed_comm_op_built"], bool)
    assert report["device"] == "cpu" or report["device"].startswith("cuda (")


def test_doctor_prints_one_line_per_fact(capsys):
    code, out, _ = cli(capsys, "doctor")
    assert code == 0
    keys = [line.split()[0] for line in out.splitlines()]
    assert {"torch", "vllm", "deepspeed", "device"} <= set(keys)


# -- the real console script ------------------------------------------------------------


def _script(name: str) -> str:
    path = Path(sys.executable).parent / name
    if not path.exists():
        pytest.skip(f"{name} is not installed next to {sys.executable}")
    return str(path)


def test_console_script_acceptance_rollout_nn(tmp_path):
    done = subprocess.run([_script("rhymectl"), "train", TINY, "rollout.nn=4", "--dry-run"],
                          capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr == "error: unknown key rollout.nn in rollout; did you mean rollout.n?\n"


def test_python_dash_m_runs_the_same_cli(tmp_path):
    done = subprocess.run([sys.executable, "-m", "rhymectl", "frobnicate"], capture_output=True,
                          text=True, timeout=60, cwd=tmp_path)
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == "error: No such command 'frobnicate'. (see `rhymectl --help`)\n"


# -- init-model never replaces what it did not build -------------------------------------


def test_init_model_refuses_a_folder_it_did_not_build(capsys, tmp_path):
    """Found in use: it built the model, then removed --out whatever it held (`--out .`
    would have removed the working directory)."""
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    for force in ([], ["--force"]):
        assert fails(capsys, "init-model", "--out", str(mine), *force) == (
            f"--out {mine} holds files that init-model did not write (no rhymectl_model.json); "
            f"give a new or empty folder")
    assert [p.name for p in mine.iterdir()] == ["notes.txt"]
    assert fails(capsys, "init-model", "--out", str(mine / "notes.txt")) == (
        f"--out {mine / 'notes.txt'} is a file; give a folder for the model")
    assert fails(capsys, "init-model", "--out", str(mine / "notes.txt" / "m")) == (
        f"--out {mine / 'notes.txt' / 'm'} cannot be created: {mine / 'notes.txt'} is a file; "
        f"give a folder for the model")


def test_init_model_replaces_another_build_only_with_force(capsys, tmp_path):
    built = tmp_path / "tiny"
    built.mkdir()
    (built / "rhymectl_model.json").write_text('{"fingerprint": "x", "task": "sort", "seed": 3}')
    assert fails(capsys, "init-model", "--out", str(built)) == (
        f"--out {built} holds a model built with other settings (task sort, seed 3); pass "
        f"--force to replace it, or give another folder")
