"""The config tree and its loader: YAML + dotted overrides → a validated, frozen `Config`.

CPU only, no heavy imports: every test runs in milliseconds. Each validation rule has a
case asserting the exact problem line the user sees.
"""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path
from typing import Literal, get_args, get_origin

import pytest

from pipeline.config import Config, ConfigError, load_config, to_dict, to_yaml
from pipeline.config.load import apply_overrides, parse_override, read_yaml
from pipeline.errors import UsageError

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "sample_configs" / "tiny.yaml"
GPU_7B = ROOT / "sample_configs" / "gpu-7b.yaml"

SECTIONS = "data, model, rollout, spec, sched, train, deepspeed, run"


def problems_of(overrides: list[str], path: str | Path | None = None) -> list[str]:
    """The problem lines of the ConfigError that loading raises."""
    with pytest.raises(ConfigError) as info:
        load_config(path, overrides)
    return info.value.problems


def usage_message(fn, *args) -> str:
    """The message of the UsageError `fn` raises; it must be one line."""
    with pytest.raises(UsageError) as info:
        fn(*args)
    message = str(info.value)
    assert "\n" not in message
    return message


def write(tmp_path: Path, text: str, name: str = "cfg.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


# -- defaults ---------------------------------------------------------------------------


def test_no_file_and_no_overrides_give_the_defaults():
    cfg = load_config(None)
    assert cfg == Config()
    assert cfg.data.task == "sort" and cfg.data.path is None
    assert cfg.model.path == "models/tiny-sort"
    assert cfg.rollout.n == 8 and cfg.rollout.temperature == 1.0
    assert cfg.spec.method == "none" and cfg.sched.policy == "auto"
    assert cfg.deepspeed.zero_stage == 1 and cfg.run.dir == "runs/tiny"


def test_an_empty_yaml_file_gives_the_defaults(tmp_path):
    assert load_config(write(tmp_path, "")) == Config()
    assert load_config(write(tmp_path, "# only a comment\n")) == Config()


def test_every_section_has_a_one_line_description():
    hints = typing.get_type_hints(Config)
    docs = {f.name: (hints[f.name].__doc__ or "").strip() for f in dataclasses.fields(Config)}
    assert list(docs) == SECTIONS.split(", ")
    for name, doc in docs.items():
        assert doc and "\n" not in doc, name


# -- YAML + overrides, typed ------------------------------------------------------------


def test_yaml_values_then_overrides_are_applied_in_order(tmp_path):
    path = write(tmp_path, "rollout:\n  n: 4\n  temperature: 0.7\ntrain:\n  lr: 3.0e-4\n")
    cfg = load_config(path, ["rollout.n=6", "rollout.n=12", "spec.method=ngram"])
    assert cfg.rollout.n == 12  # the last override wins
    assert cfg.rollout.temperature == 0.7  # from the file
    assert cfg.train.lr == 3e-4
    assert cfg.spec.method == "ngram"  # a section the file does not have
    assert cfg.rollout.top_p == 1.0  # untouched default


def test_overrides_are_typed_like_yaml():
    cfg = load_config(None, [
        "rollout.n=4",  # int
        "rollout.temperature=1",  # int accepted for a float, stored as float
        "train.lr=0.001",  # float
        "data.shuffle=false",  # bool
        "deepspeed.bf16=true",
        "data.reward=null",  # null for an Optional
        "model.path=/models/my policy",  # string with a space
        "data.split=",  # empty string
    ])
    assert cfg.rollout.n == 4 and type(cfg.rollout.n) is int
    assert cfg.rollout.temperature == 1.0 and type(cfg.rollout.temperature) is float
    assert cfg.train.lr == 0.001
    assert cfg.data.shuffle is False and cfg.deepspeed.bf16 is True
    assert cfg.data.reward is None
    assert cfg.model.path == "/models/my policy"
    assert cfg.data.split == ""


def test_yaml_file_ints_become_floats_too(tmp_path):
    cfg = load_config(write(tmp_path, "train:\n  grad_clip: 2\n"))
    assert cfg.train.grad_clip == 2.0 and type(cfg.train.grad_clip) is float


@pytest.mark.parametrize("text, expected", [
    ("rollout.n=4", (["rollout", "n"], 4)),
    ("rollout.temperature=0.5", (["rollout", "temperature"], 0.5)),
    ("data.task=null", (["data", "task"], None)),
    ("data.shuffle=true", (["data", "shuffle"], True)),
    ("model.path=", (["model", "path"], "")),
    (" run.dir = runs/x ", (["run", "dir"], "runs/x")),
    ("data.reward=a=b", (["data", "reward"], "a=b")),  # only the first '=' splits
    ("data.reward=[unclosed", (["data", "reward"], "[unclosed")),  # bad YAML: kept as text
])
def test_parse_override(text, expected):
    assert parse_override(text) == expected


@pytest.mark.parametrize("text", ["rollout.n", "=5", "  =5", ""])
def test_an_override_without_key_and_equals_is_a_usage_error(text):
    assert usage_message(parse_override, text) == (
        f"override '{text}' is not key=value; write e.g. rollout.n=8")


def test_load_config_reports_a_bad_override_the_same_way():
    assert usage_message(load_config, None, ["rollout.n"]) == (
        "override 'rollout.n' is not key=value; write e.g. rollout.n=8")


def test_apply_overrides_copies_the_tree_and_creates_sections():
    tree = {"rollout": {"n": 4}, "model": "not a mapping"}
    out = apply_overrides(tree, ["rollout.n=6", "spec.method=ngram", "model.path=x"])
    assert out == {"rollout": {"n": 6}, "model": {"path": "x"}, "spec": {"method": "ngram"}}
    assert tree == {"rollout": {"n": 4}, "model": "not a mapping"}  # input untouched


def test_an_exponent_without_a_dot_is_a_number():
    assert load_config(None, ["train.lr=1e-4"]).train.lr == 1e-4


def test_an_override_value_is_not_cut_at_a_hash():
    assert load_config(None, ["run.dir=runs/exp #2"]).run.dir == "runs/exp #2"


# -- one rule, one exact problem line ---------------------------------------------------

POSITIVE = "a number > 0"
NON_NEGATIVE = "a number >= 0"
FRACTION = "a number in (0, 1]"

# key → (bad override value, what the problem line says is expected)
RULES = {
    "data.train_size": ("0", "0", POSITIVE),
    "data.eval_size": ("-1", "-1", POSITIVE),
    "data.train_batch_size": ("0", "0", POSITIVE),
    "data.max_prompt_length": ("0", "0", POSITIVE),
    "rollout.n": ("1", "1", "an integer >= 2 (GRPO needs a group)"),
    "rollout.temperature": ("-0.5", "-0.5", NON_NEGATIVE),
    "rollout.top_p": ("0", "0.0", FRACTION),
    "rollout.top_k": ("0", "0", "-1 (off) or an integer >= 1"),
    "rollout.max_tokens": ("0", "0", POSITIVE),
    "rollout.gpu_memory_utilization": ("1.5", "1.5", FRACTION),
    "rollout.kv_cache_gib": ("0", "0.0", POSITIVE),
    "rollout.max_num_seqs": ("0", "0", POSITIVE),
    "rollout.logprob_check_every": ("-1", "-1", NON_NEGATIVE),
    "rollout.tensor_parallel_size": ("0", "0", POSITIVE),
    "spec.num_speculative_tokens": ("0", "0", POSITIVE),
    "spec.history_epochs": ("0", "0", POSITIVE),
    "spec.min_path_prob": ("0", "0.0", FRACTION),
    "spec.max_spec_factor": ("0", "0.0", POSITIVE),
    "spec.max_cached_prompts": ("0", "0", POSITIVE),
    "spec.thin_pass_tokens": ("-1", "-1", NON_NEGATIVE),
    "spec.thin_draft_tokens": ("-1", "-1", NON_NEGATIVE),
    "spec.max_draft_rows": ("0", "0", POSITIVE),
    "spec.global_below": ("-1", "-1.0", NON_NEGATIVE),
    "sched.chunk_tokens": ("0", "0", POSITIVE),
    "sched.tier2_workers_frac": ("1.0", "1.0", "a number in [0, 1)"),
    "sched.tier2_max_seqs": ("0", "0", POSITIVE),
    "sched.migrate_gap": ("0", "0", POSITIVE),
    "sched.tail_batching.overprovision": ("-0.5", "-0.5", NON_NEGATIVE),
    "sched.tail_batching.max_waits": ("-1", "-1", NON_NEGATIVE),
    "sched.store_timeout_s": ("0", "0.0", POSITIVE),
    "sched.sim_requests_per_worker": ("0", "0", POSITIVE),
    "train.total_steps": ("0", "0", POSITIVE),
    "train.lr": ("0", "0.0", POSITIVE),
    "train.weight_decay": ("-0.1", "-0.1", NON_NEGATIVE),
    "train.grad_clip": ("-1", "-1.0", NON_NEGATIVE),
    "train.ppo_mini_batch_size": ("0", "0", POSITIVE),
    "train.ppo_micro_batch_size": ("0", "0", POSITIVE),
    "train.ppo_epochs": ("0", "0", POSITIVE),
    "train.clip_ratio_low": ("1.2", "1.2", FRACTION),
    "train.clip_ratio_high": ("0", "0.0", FRACTION),
    "train.kl_coef": ("-0.001", "-0.001", NON_NEGATIVE),
    "train.clip_ratio_c": ("1", "1.0", "null (off) or a number > 1"),
    "deepspeed.zero_stage": ("4", "4", "0, 1, 2 or 3"),
    "run.checkpoint_every": ("0", "0", POSITIVE),
    "spec.draft_layers": ("0", "0", POSITIVE),
    "spec.draft_updates": ("0", "0", POSITIVE),
    "spec.draft_window": ("0", "0", POSITIVE),
    "spec.min_accept": ("1", "1.0", "a number in [0, 1)"),
    "spec.draft_lr": ("0", "0.0", POSITIVE),
    "spec.draft_vocab": ("-1", "-1", NON_NEGATIVE),
    "spec.draft_distill": ("-1", "-1", NON_NEGATIVE),
    "spec.draft_warmup_prompts": ("0", "0", POSITIVE),
    "spec.draft_warmup_updates": ("0", "0", POSITIVE),
    "run.keep_checkpoints": ("0", "0", POSITIVE),
    "run.eval_every": ("-1", "-1", NON_NEGATIVE),
    "run.eval_n": ("-1", "-1", NON_NEGATIVE),
    "run.threads": ("-2", "-2", NON_NEGATIVE),
    "run.dist_timeout_min": ("0", "0.0", POSITIVE),
    "run.dir": ("runs/../x", "'runs/../x'",
                "a directory path without '..' components (writes stay inside it)"),
    # literals
    "model.dtype": ("fp8", "'fp8'", "one of float32, bfloat16, float16"),
    "spec.method": ("fast", "'fast'", "one of none, ngram, suffix, history, group, history+group, "
                    "history+group+model"),
    "spec.budget": ("fast", "'fast'", "one of tree, critical, throughput"),
    "spec.pass_cost": ("measured", "'measured'", "one of fixed, online"),
    "spec.own_tree": ("some", "'some'", "one of thin, always, never"),
    "spec.draft_warmup": ("off", "False (YAML reads off, no and false as False: quote the word)",
                          "one of none, eval, rollout"),
    "spec.draft_device": ("gpu", "'gpu'", "one of cpu, cuda, auto"),
    "sched.policy": ("random", "'random'", "one of auto, static, histopipe, tier2, seer"),
    "train.adv_estimator": ("ppo", "'ppo'", "one of grpo, grpo_no_std"),
    "train.loss_agg_mode": ("sum", "'sum'", "one of token-mean, seq-mean-token-mean"),
    "train.kl_type": ("k3", "'k3'", "one of low_var_kl, k1, k2"),
    "run.wandb_mode": ("cloud", "'cloud'", "one of online, offline"),
    # lists
    "run.loggers": ("[jsonl,tensorbord]", "['jsonl', 'tensorbord']",
                    "a list of jsonl, console, tensorboard, wandb"),
}


@pytest.mark.parametrize("key", sorted(RULES))
def test_each_rule_names_the_key_the_value_and_what_is_allowed(key):
    raw, shown, allowed = RULES[key]
    assert problems_of([f"{key}={raw}"]) == [f"{key} = {shown} is not allowed; expected {allowed}"]


def _fields():
    hints = typing.get_type_hints(Config)
    for section in dataclasses.fields(Config):
        cls = hints[section.name]
        field_hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            hint = field_hints[f.name]
            if dataclasses.is_dataclass(hint):  # a nested section: sched.tail_batching
                sub_hints = typing.get_type_hints(hint)
                for g in dataclasses.fields(hint):
                    yield f"{section.name}.{f.name}.{g.name}", g, sub_hints[g.name]
                continue
            yield f"{section.name}.{f.name}", f, hint


def test_every_checked_or_literal_field_has_a_rule_case():
    ruled = {key for key, f, hint in _fields()
             if "check" in f.metadata or get_origin(hint) is Literal}
    assert ruled - set(RULES) == set()


def test_the_check_values_at_the_boundary_are_allowed():
    cfg = load_config(None, ["rollout.n=2", "rollout.top_p=1", "rollout.top_k=-1",
                             "rollout.temperature=0", "deepspeed.zero_stage=0",
                             "train.clip_ratio_high=1", "run.eval_every=0", "spec.method=history+group"])
    assert (cfg.rollout.n, cfg.rollout.top_p, cfg.rollout.top_k) == (2, 1.0, -1)
    assert cfg.deepspeed.zero_stage == 0 and cfg.spec.method == "history+group"


@pytest.mark.parametrize("override, problem", [
    ("rollout.n=8.0", "rollout.n = 8.0 is not allowed; expected an integer"),
    ("rollout.n=true", "rollout.n = True is not allowed; expected an integer"),
    ("rollout.n=eight", "rollout.n = 'eight' is not allowed; expected an integer"),
    ("rollout.temperature=true", "rollout.temperature = True is not allowed; expected a number"),
    ("data.shuffle=1", "data.shuffle = 1 is not allowed; expected true or false"),
    ("run.dir=null", "run.dir = None is not allowed; expected a string"),
    ("rollout.top_k=null", "rollout.top_k = None is not allowed; expected an integer"),
])
def test_a_wrong_type_names_the_key_the_value_and_the_type(override, problem):
    assert problems_of([override]) == [problem]


def test_an_unknown_key_gets_a_did_you_mean():
    assert problems_of(["rollout.nn=4"]) == [
        "unknown key rollout.nn in rollout; did you mean rollout.n?"]
    assert problems_of(["train.warmup=1"]) == [
        "unknown key train.warmup in train; valid keys: total_steps, lr, weight_decay, "
        "grad_clip, ppo_mini_batch_size, ppo_micro_batch_size, ppo_epochs, clip_ratio_low, "
        "clip_ratio_high, adv_estimator, loss_agg_mode, kl_coef, kl_type, clip_ratio_c, "
        "gradient_checkpointing"]
    assert problems_of(["spec.methd=ngram"]) == [
        "unknown key spec.methd in spec; did you mean spec.method?"]


def test_an_unknown_key_in_the_yaml_file_is_reported_like_an_override(tmp_path):
    path = write(tmp_path, "rollout:\n  temprature: 0.5\n")
    assert problems_of([], path) == [
        "unknown key rollout.temprature in rollout; did you mean rollout.temperature?"]


def test_an_unknown_section_gets_a_did_you_mean_or_the_valid_sections():
    assert problems_of(["rolout.n=4"]) == ["unknown key rolout in the top level; did you mean rollout?"]
    assert problems_of(["foo.bar=1"]) == [f"unknown key foo in the top level; valid keys: {SECTIONS}"]


def test_a_section_that_is_not_a_mapping(tmp_path):
    assert problems_of(["rollout=5"]) == ["rollout must be a mapping, got 5"]
    assert problems_of([], write(tmp_path, "model: models/x\n")) == [
        "model must be a mapping, got 'models/x'"]


# -- cross checks -----------------------------------------------------------------------


def test_mini_batch_larger_than_the_batch():
    assert problems_of(["train.ppo_mini_batch_size=32"]) == [
        "train.ppo_mini_batch_size = 32 is larger than data.train_batch_size = 16; it must be <= it"]


def test_batch_not_a_multiple_of_the_mini_batch():
    assert problems_of(["train.ppo_mini_batch_size=6"]) == [
        "data.train_batch_size = 16 is not a multiple of train.ppo_mini_batch_size = 6"]


def test_task_and_path_both_null():
    assert problems_of(["data.task=null"]) == [
        "data.task and data.path are both null; set data.task to a built-in task or data.path "
        "to a data set"]


def test_a_data_path_alone_is_enough():
    cfg = load_config(None, ["data.task=null", "data.path=prompts.jsonl"])
    assert cfg.data.task is None and cfg.data.path == "prompts.jsonl"


# -- every problem at once --------------------------------------------------------------


def test_every_field_problem_is_reported_at_once():
    with pytest.raises(ConfigError) as info:
        load_config(TINY, ["rollout.n=1", "spec.method=fast", "foo=1", "train.lr=-1",
                           "deepspeed.zero_stage=5"])
    expected = [
        f"unknown key foo in the top level; valid keys: {SECTIONS}",
        "rollout.n = 1 is not allowed; expected an integer >= 2 (GRPO needs a group)",
        "spec.method = 'fast' is not allowed; expected one of none, ngram, suffix, history, "
        "group, history+group, history+group+model",
        "train.lr = -1.0 is not allowed; expected a number > 0",
        "deepspeed.zero_stage = 5 is not allowed; expected 0, 1, 2 or 3",
    ]
    assert info.value.problems == expected
    assert str(info.value) == "config has 5 problems:\n  " + "\n  ".join(expected)


def test_every_cross_check_problem_is_reported_at_once():
    with pytest.raises(ConfigError) as info:
        load_config(None, ["data.task=null", "train.ppo_mini_batch_size=32"])
    assert info.value.problems == [
        "data.task and data.path are both null; set data.task to a built-in task or data.path "
        "to a data set",
        "train.ppo_mini_batch_size = 32 is larger than data.train_batch_size = 16; it must be <= it",
    ]
    assert str(info.value).startswith("config has 2 problems:\n  data.task and data.path")


def test_one_problem_is_the_whole_message_and_a_usage_error():
    with pytest.raises(UsageError) as info:
        load_config(None, ["rollout.n=1"])
    assert isinstance(info.value, ConfigError) and info.value.exit_code == 2
    assert str(info.value) == (
        "rollout.n = 1 is not allowed; expected an integer >= 2 (GRPO needs a group)")


# -- the file itself --------------------------------------------------------------------


def test_a_missing_file(tmp_path):
    path = tmp_path / "nope.yaml"
    assert usage_message(load_config, path) == (
        f"config file {path} does not exist; pass the path of a YAML file (see sample_configs/)")
    assert usage_message(load_config, tmp_path) == (
        f"config file {tmp_path} is a directory; pass the path of a YAML file (see sample_configs/)")


@pytest.mark.parametrize("text, where", [
    ("data:\n  task: sort\n   path: x\n", "at line 3, column 8: mapping values are not allowed here"),
    ("data:\n  task: [sort\nmodel:\n  path: x\n", "at line 3, column 6: expected ',' or ']', but got ':'"),
    ("data:\n\ttask: sort\n", "at line 2, column 1: found character '\\t' that cannot start any token"),
])
def test_malformed_yaml_names_line_and_column(tmp_path, text, where):
    path = write(tmp_path, text)
    assert usage_message(read_yaml, path) == f"config file {path} is not valid YAML {where}"
    assert usage_message(load_config, path) == f"config file {path} is not valid YAML {where}"


@pytest.mark.parametrize("text, kind", [("- data\n- model\n", "list"), ("just text\n", "str"),
                                        ("42\n", "int")])
def test_yaml_that_is_not_a_mapping(tmp_path, text, kind):
    path = write(tmp_path, text)
    assert usage_message(load_config, path) == (
        f"config file {path} must hold a mapping of sections (data:, model:, rollout:, ...), "
        f"not a {kind}")


def test_yaml_tags_are_not_executed(tmp_path):
    path = write(tmp_path, "run:\n  dir: !!python/object/apply:os.getcwd []\n")
    message = usage_message(load_config, path)
    assert message.startswith(f"config file {path} is not valid YAML at line 2, column 8: ")


# -- sample configs ---------------------------------------------------------------------


def test_the_tiny_sample_config_validates():
    cfg = load_config(TINY)
    assert cfg.data.task == "sort" and cfg.model.path == "models/tiny-sort"  # what init-model builds
    assert cfg.run.dir == "runs/tiny"  # what `make demo` reports on
    assert cfg.data.train_batch_size % cfg.train.ppo_mini_batch_size == 0
    header = [line for line in Path(TINY).read_text().splitlines() if line.startswith("#")]
    assert any("rhymectl train sample_configs/tiny.yaml" in line for line in header)


def test_the_gpu_7b_sample_config_validates():
    # Config validation only: preflight would need the 7B model and the data on disk.
    cfg = load_config(GPU_7B)
    assert cfg.data.task is None and cfg.data.path == "/data/gsm8k/train.parquet"
    assert cfg.data.reward == "gsm8k" and cfg.data.prompt_key == "prompt"  # built-in reward
    assert "tensorboard" in cfg.run.loggers
    assert cfg.model.dtype == "bfloat16" and cfg.deepspeed.zero_stage == 3 and cfg.deepspeed.bf16
    assert cfg.train.lr == 1e-6 and cfg.train.clip_ratio_high == 0.28
    assert cfg.data.train_batch_size % cfg.train.ppo_mini_batch_size == 0


@pytest.mark.parametrize("path", [TINY, GPU_7B], ids=["tiny", "gpu-7b"])
def test_sample_configs_round_trip_through_yaml(tmp_path, path):
    cfg = load_config(path)
    again = load_config(write(tmp_path, to_yaml(cfg)))
    assert again == cfg
    assert to_dict(again) == to_dict(cfg)


# -- frozen -----------------------------------------------------------------------------


def test_a_loaded_config_cannot_be_mutated():
    cfg = load_config(TINY)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.rollout.n = 4
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.rollout = None
    changed = dataclasses.replace(cfg, rollout=dataclasses.replace(cfg.rollout, n=4))
    assert changed.rollout.n == 4 and cfg.rollout.n == 8


def test_literal_choices_in_rules_match_the_schema():
    """The literal cases above spell the schema's choices, in order."""
    for key, f, hint in _fields():
        if get_origin(hint) is Literal:
            assert RULES[key][2] == "one of " + ", ".join(get_args(hint)), key


def test_string_fields_take_override_values_verbatim():
    cfg = load_config(None, ["data.task=5", "model.path=[a, b]", "data.reward=mymod:",
                             "run.dir=2024"])
    assert (cfg.data.task, cfg.model.path, cfg.data.reward, cfg.run.dir) == \
        ("5", "[a, b]", "mymod:", "2024")


def test_a_wrong_type_in_a_yaml_file_is_still_refused(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("data:\n  task: 5\nmodel:\n  path: [a, b]\n")
    assert problems_of([], path) == [
        "data.task = 5 is not allowed; expected a string or null",
        "model.path = ['a', 'b'] is not allowed; expected a string",
    ]
