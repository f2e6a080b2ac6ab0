"""Built-in tasks (sort, reverse), their rewards, and the data layer; CPU only, fast.

Expected rewards are worked out by hand in the comments next to them.
"""

from __future__ import annotations

import hashlib
import json
import random

import numpy as np
import pytest

from pipeline.errors import UsageError
from pipeline.tasks import get_task, prompt_id, task_names

SORT_PROMPT, SORT_ANSWER = "sort 230:", "023"
REV_PROMPT, REV_ANSWER = "rev 2301:", "1032"


def usage_error(fn, *args, **kwargs) -> str:
    """The message of the UsageError `fn` raises; it must be one line."""
    with pytest.raises(UsageError) as info:
        fn(*args, **kwargs)
    message = str(info.value)
    assert "\n" not in message
    return message


# -- registry ---------------------------------------------------------------------------


def test_registry_knows_both_tasks_and_suggests_close_names():
    assert {"sort", "reverse"} <= set(task_names())
    assert get_task("sort").name == "sort"
    assert "did you mean 'reverse'?" in usage_error(get_task, "revers")
    message = usage_error(get_task, "zzz")
    assert "unknown task 'zzz'" in message and "did you mean" not in message
    assert "reverse, sort" in message


# -- solutions ---------------------------------------------------------------------------


def test_sort_solution_matches_the_documented_format():
    assert get_task("sort").solution("230") == "2>2|3>23|0>023|ans 023"
    assert get_task("sort").solution("5") == "5>5|ans 5"


def test_reverse_solution_matches_the_documented_format():
    assert get_task("reverse").solution("2301") == "1|10|103|1032|ans 1032"
    assert get_task("reverse").solution("7") == "7|ans 7"


@pytest.mark.parametrize("name", ["sort", "reverse"])
def test_generated_rows_are_consistent(name):
    task = get_task(name)
    for row in task.generate(200, seed=3):
        assert set(row) == {"id", "prompt", "answer", "solution"}
        assert row["prompt"].endswith(":")
        digits = row["prompt"].split(" ")[1][:-1]
        assert 1 <= len(digits) <= 12 and digits.isdigit()
        expected = "".join(sorted(digits)) if name == "sort" else digits[::-1]
        assert row["answer"] == expected
        assert row["solution"].endswith("|ans " + expected)
        assert row["solution"].count("|") == len(digits)  # one step per digit
        assert task.reward(row["prompt"], row["solution"], row["answer"]) == 1.0
        assert task.is_correct(row["prompt"], row["solution"], row["answer"])


@pytest.mark.parametrize("name", ["sort", "reverse"])
def test_generation_is_deterministic_and_ids_are_prompt_hashes(name):
    task = get_task(name)
    first, again, other = task.generate(300, 11), task.generate(300, 11), task.generate(300, 12)
    assert first == again
    assert first != other
    for row in first:
        assert row["id"] == hashlib.sha1(row["prompt"].encode()).hexdigest()[:12]
    # the same prompt drawn under another seed (another split or epoch) has the same id
    ids_by_prompt = {r["prompt"]: r["id"] for r in first}
    shared = [r for r in other if r["prompt"] in ids_by_prompt]
    assert shared
    assert all(ids_by_prompt[r["prompt"]] == r["id"] for r in shared)


@pytest.mark.parametrize("name", ["sort", "reverse"])
def test_solution_lengths_are_long_tailed(name):
    lengths = np.array([len(r["solution"]) for r in get_task(name).generate(2000, seed=0)])
    median, p99 = np.percentile(lengths, [50, 99])
    assert p99 / median >= 4, (median, p99)


def test_bad_row_count_and_settings_are_usage_errors():
    assert "positive integer" in usage_error(get_task("sort").generate, 0, 1)
    from pipeline.tasks.sort import SortTask

    assert "max_digits" in usage_error(SortTask, max_digits=0)
    assert "decay" in usage_error(SortTask, decay=0.0)


# -- rewards -----------------------------------------------------------------------------

SORT_CASES = [
    # response, exact reward, partial reward
    ("2>2|3>23|0>023|ans 023", 1.0, 1.0),
    (" 2>2|3>23|0>023|ans 023\n", 1.0, 1.0),  # surrounding whitespace is ignored
    # steps valid, valid, invalid (023 expected) -> 2/3; answer 203 vs 023 matches at 1 of 3
    ("2>2|3>23|0>203|ans 203", 0.0, 0.5 * 2 / 3 + 0.5 * 1 / 3),
    # step 2 wrong (23 expected), step 3 inserts 0 into the written 33 correctly -> 2/3;
    # answer 033 vs 023 matches at 2 of 3
    ("2>2|3>33|0>033|ans 033", 0.0, 0.5 * 2 / 3 + 0.5 * 2 / 3),
    # step 1 names 5, not the first input digit 2; steps 2 and 3 insert correctly into the
    # written lists -> 2/3; answer 035 vs 023 matches at 1 of 3
    ("5>5|3>35|0>035|ans 035", 0.0, 0.5 * 2 / 3 + 0.5 * 1 / 3),
    # one valid step of three; answer 2 vs 023 matches at 0 of max(1, 3)
    ("2>2|ans 2", 0.0, 0.5 * 1 / 3),
    ("ans ", 0.0, 0.0),  # empty answer: format ok, nothing right
    # right answer with wrong or no steps: outcome reward, full credit
    ("9>9|ans 023", 1.0, 1.0),
    ("ans 023", 1.0, 1.0),
    # format gate
    ("", 0.0, 0.0),
    ("hello world", 0.0, 0.0),
    ("2>2|3>23|0>023|", 0.0, 0.0),  # no answer
    ("2>2|3>23|0>023|ans 023 and more", 0.0, 0.0),  # text after the answer
    ("2>2|3>23|0>023|ans 023|", 0.0, 0.0),
    ("2>2|3>23|0>023|ans023", 0.0, 0.0),
    ("2>2|3>23|0>023|ANS 023", 0.0, 0.0),
    ("2>2|3>23|0>0٢3|ans ٠٢٣", 0.0, 0.0),  # non-ASCII digits
    ("2>2|3>2x|0>023|ans 023", 0.0, 0.0),  # a malformed step
    ("2>2|3>23|0>023|0>0023|ans 023", 0.0, 0.0),  # more steps than digits: runaway
    ("2>2|" * 5000 + "ans 023", 0.0, 0.0),
    ("2>2" + "2" * 100 + "|ans 023", 0.0, 0.0),  # far longer than the reference
]

REV_CASES = [
    ("1|10|103|1032|ans 1032", 1.0, 1.0),
    # steps ok, ok, wrong (103), ok (130 + "2") -> 3/4; 1302 vs 1032 matches at 2 of 4
    ("1|10|130|1302|ans 1302", 0.0, 0.5 * 3 / 4 + 0.5 * 2 / 4),
    # two steps of four; 10 vs 1032 matches at 2 of 4
    ("1|10|ans 10", 0.0, 0.5 * 2 / 4 + 0.5 * 2 / 4),
    # all steps right but the answer copied forward: 2301 vs 1032 matches nowhere
    ("1|10|103|1032|ans 2301", 0.0, 0.5),
    ("ans 1032", 1.0, 1.0),
    ("", 0.0, 0.0),
    ("1|10|103|1032|10322|ans 1032", 0.0, 0.0),
    ("1|10|103|1032|ans 1032 ok", 0.0, 0.0),
    ("1|1a|ans 1032", 0.0, 0.0),
    ("1||ans 1", 0.0, 0.0),  # an empty step
]


@pytest.mark.parametrize("response,exact,partial", SORT_CASES, ids=[str(i) for i in range(len(SORT_CASES))])
def test_sort_reward_by_hand(response, exact, partial):
    task = get_task("sort")
    assert task.reward(SORT_PROMPT, response, SORT_ANSWER, partial_credit=False) == exact
    assert task.reward(SORT_PROMPT, response, SORT_ANSWER, partial_credit=True) == pytest.approx(partial)
    assert task.is_correct(SORT_PROMPT, response, SORT_ANSWER) == (exact == 1.0)


@pytest.mark.parametrize("response,exact,partial", REV_CASES, ids=[str(i) for i in range(len(REV_CASES))])
def test_reverse_reward_by_hand(response, exact, partial):
    task = get_task("reverse")
    assert task.reward(REV_PROMPT, response, REV_ANSWER, partial_credit=False) == exact
    assert task.reward(REV_PROMPT, response, REV_ANSWER, partial_credit=True) == pytest.approx(partial)
    assert task.is_correct(REV_PROMPT, response, REV_ANSWER) == (exact == 1.0)


def test_huge_responses_are_rejected_without_parsing():
    for name, prompt, answer in (("sort", SORT_PROMPT, SORT_ANSWER), ("reverse", REV_PROMPT, REV_ANSWER)):
        task = get_task(name)
        for response in ("x" * 10_000_000, ("|" * 1_000_000) + "ans " + answer):
            assert task.reward(prompt, response, answer, partial_credit=True) == 0.0
            assert not task.is_correct(prompt, response, answer)


def test_prompt_may_carry_a_prefix_but_must_be_of_the_task():
    task = get_task("sort")
    assert task.reward("few-shot example\nsort 230:", "ans 023", "023") == 1.0
    message = usage_error(task.reward, "rev 2301:", "ans 1032", "1032")
    assert "is not a 'sort' prompt" in message and "'sort 230:'" in message


@pytest.mark.parametrize("name", ["sort", "reverse"])
def test_rewards_of_mutated_solutions_stay_in_range(name):
    """Partial credit is in [0, 1], never below exact, and 1 exactly when correct."""
    task, rng = get_task(name), random.Random(0)
    alphabet = "0123456789>| ans"
    for row in task.generate(60, seed=5):
        for _ in range(10):
            text = list(row["solution"])
            for _ in range(rng.randint(1, 3)):
                i = rng.randrange(len(text) + 1)
                op = rng.choice(["insert", "delete", "replace"])
                if op == "insert":
                    text.insert(i, rng.choice(alphabet))
                elif text and i < len(text):
                    text[i : i + 1] = [] if op == "delete" else [rng.choice(alphabet)]
            response = "".join(text)
            exact = task.reward(row["prompt"], response, row["answer"])
            partial = task.reward(row["prompt"], response, row["answer"], partial_credit=True)
            correct = task.is_correct(row["prompt"], response, row["answer"])
            assert exact in (0.0, 1.0) and exact == float(correct)
            assert 0.0 <= partial <= 1.0 and partial >= exact
            assert (partial == 1.0) == correct


# -- data layer --------------------------------------------------------------------------

datasets = pytest.importorskip("datasets")
from pipeline.tasks import data  # noqa: E402  (needs `datasets`)


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_task_dataset_round_trips_through_parquet(tmp_path):
    ds = data.build_task_dataset("reverse", 40, seed=2)
    assert ds.column_names == ["id", "prompt", "answer", "solution"]
    assert ds.to_list() == get_task("reverse").generate(40, 2)
    path = data.save_dataset(ds.select(range(39, -1, -1)), tmp_path / "sub" / "train.parquet")
    assert [p.name for p in path.parent.iterdir()] == ["train.parquet"]  # no temp file left
    assert data.load_dataset_file(path).to_list() == ds.to_list()[::-1]
    assert "must end in .parquet" in usage_error(data.save_dataset, ds, tmp_path / "x.jsonl")
    message = usage_error(data.load_dataset_file, tmp_path / "gone.parquet")
    assert "does not exist" in message and "gone.parquet" in message


def test_user_jsonl_with_custom_keys_is_normalised(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [{"q": "sort 21:", "a": 12}, {"q": "rev 5:", "a": "5", "x": 1}])
    ds = data.load_user_dataset(path, prompt_key="q", answer_key="a")
    assert ds.column_names == ["id", "prompt", "answer"]
    assert ds["prompt"] == ["sort 21:", "rev 5:"]
    assert ds["answer"] == ["12", "5"]
    assert ds["id"] == [prompt_id("sort 21:"), prompt_id("rev 5:")]


def test_user_json_parquet_and_saved_folders_load_alike(tmp_path):
    rows = [{"id": 7, "prompt": "sort 31:", "answer": "13"}, {"prompt": "sort 4:", "answer": "4"}]
    expected = [
        {"id": "7", "prompt": "sort 31:", "answer": "13"},
        {"id": prompt_id("sort 4:"), "prompt": "sort 4:", "answer": "4"},
    ]
    (tmp_path / "list.json").write_text(json.dumps(rows))
    columns = {k: [r.get(k) for r in rows] for k in ("id", "prompt", "answer")}
    (tmp_path / "cols.json").write_text(json.dumps(columns))
    (tmp_path / "lines.json").write_text("\n".join(json.dumps(r) for r in rows))
    full = datasets.Dataset.from_dict(columns)  # the missing id becomes None
    data.save_dataset(full, tmp_path / "d.parquet")
    full.save_to_disk(str(tmp_path / "one"))
    datasets.DatasetDict({"test": full}).save_to_disk(str(tmp_path / "dict"))
    for name in ("list.json", "cols.json", "lines.json", "d.parquet", "one"):
        assert data.load_user_dataset(str(tmp_path / name)).to_list() == expected, name
    assert data.load_user_dataset(str(tmp_path / "dict"), split="test").to_list() == expected
    message = usage_error(data.load_user_dataset, str(tmp_path / "dict"), split="train")
    assert "has no split 'train' (splits: test); set data.split" in message


def load_error(path, **keys) -> str:
    return usage_error(data.load_user_dataset, str(path), **keys)


def test_user_data_errors_name_the_problem_and_the_key(tmp_path):
    missing = str(tmp_path / "nope.jsonl")
    assert load_error(missing) == f"data.path {missing!r} does not exist; check data.path"
    assert "does not exist" in usage_error(data.load_user_dataset, "./not/here")

    csv = tmp_path / "d.csv"
    csv.write_text("prompt,answer\n")
    message = load_error(csv)
    assert "unsupported extension '.csv'" in message and ".jsonl, .json, .parquet" in message

    path = write_jsonl(tmp_path / "cols.jsonl", [{"question": "sort 1:", "target": "1"}])
    message = usage_error(data.load_user_dataset, path)
    assert "has no prompt column 'prompt' (columns: question, target); set data.prompt_key" in message
    message = usage_error(data.load_user_dataset, path, prompt_key="question")
    assert "has no answer column 'answer' (columns: question, target); set data.answer_key" in message

    rows = [{"prompt": "sort 1:", "answer": "1"}, {"prompt": "  ", "answer": "2"}, {"answer": "3"}]
    message = usage_error(data.load_user_dataset, write_jsonl(tmp_path / "empty_prompts.jsonl", rows))
    assert "2 of 3 rows" in message and "have an empty prompt (first at row 1)" in message

    message = load_error(write_jsonl(tmp_path / "lists.jsonl", [{"prompt": ["a"], "answer": "1"}]))
    assert "holds list values, not text (row 0)" in message

    (tmp_path / "blank.jsonl").write_text("\n\n")
    assert "has no rows" in load_error(tmp_path / "blank.jsonl")
    data.save_dataset(datasets.Dataset.from_dict({"prompt": [], "answer": []}), tmp_path / "none.parquet")
    assert "has no rows" in load_error(tmp_path / "none.parquet")

    (tmp_path / "bad.jsonl").write_text('{"prompt": "sort 1:", "answer": "1"}\n{"prompt": \n')
    bad = str(tmp_path / "bad.jsonl")
    assert f"line 2 of {bad!r} is not valid JSON" in load_error(bad)
    (tmp_path / "scalar.jsonl").write_text("3\n")
    assert "line 1 of" in load_error(tmp_path / "scalar.jsonl")
    (tmp_path / "ragged.json").write_text('{"prompt": ["a", "b"], "answer": ["1"]}')
    assert "different lengths" in load_error(tmp_path / "ragged.json")
    (tmp_path / "corrupt.parquet").write_text("not parquet")
    assert "cannot read parquet file" in load_error(tmp_path / "corrupt.parquet")
    (tmp_path / "folder").mkdir()
    assert "is a folder but not a data set written by save_to_disk" in load_error(tmp_path / "folder")


def test_hub_names_go_to_load_dataset_and_failures_become_usage_errors(monkeypatch):
    calls = []

    def fake_load_dataset(name, split):
        calls.append((name, split))
        if name == "org/ok":
            return datasets.Dataset.from_dict({"question": ["sort 9:"], "answer": ["9"]})
        raise FileNotFoundError(f"Dataset '{name}' doesn't exist on the Hub\nor cannot be accessed.")

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    assert data.load_user_dataset("org/ok", split="test", prompt_key="question")["prompt"] == ["sort 9:"]
    message = usage_error(data.load_user_dataset, "org/missing")
    assert calls == [("org/ok", "test"), ("org/missing", "train")]
    assert message.startswith("data.path 'org/missing' is not a local path and loading it from the hub")
    assert "doesn't exist on the Hub" in message and "check data.path and data.split" in message


# -- reward resolution -------------------------------------------------------------------

REWARD_MODULE = '''
LIMIT = 3

def first_char(prompt, response, answer):
    return float(response[:1] == answer[:1])

class Scorers:
    @staticmethod
    def length(prompt, response, answer):
        return min(len(response), 10) / 10

def two_args(prompt, response):
    return 0.0
'''


def test_resolve_reward_builtin_binds_partial_credit():
    response = "2>2|3>23|0>203|ans 203"  # 0.5 with partial credit (see SORT_CASES)
    assert data.resolve_reward("sort")(SORT_PROMPT, response, SORT_ANSWER) == 0.0
    partial = data.resolve_reward("sort", partial_credit=True)
    assert partial(SORT_PROMPT, response, SORT_ANSWER) == pytest.approx(0.5)
    assert data.resolve_reward("reverse")(REV_PROMPT, "1|10|103|1032|ans 1032", REV_ANSWER) == 1.0
    message = usage_error(data.resolve_reward, "sortt")
    assert message == (
        "unknown reward 'sortt'; did you mean 'sort'? use a built-in reward (gsm8k, math), a "
        "built-in task (reverse, sort) or module:function"
    )


def test_resolve_reward_imports_module_functions(tmp_path, monkeypatch):
    (tmp_path / "my_rewards_mod.py").write_text(REWARD_MODULE)
    (tmp_path / "broken_rewards_mod.py").write_text("raise RuntimeError('boom')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert data.resolve_reward("my_rewards_mod:first_char")("p", "9x", "95") == 1.0
    assert data.resolve_reward("my_rewards_mod:first_char")("p", "8x", "95") == 0.0
    assert data.resolve_reward("my_rewards_mod:Scorers.length")("p", "abcd", "") == pytest.approx(0.4)

    assert "cannot import module 'no_such_mod_xyz'" in usage_error(data.resolve_reward, "no_such_mod_xyz:f")
    message = usage_error(data.resolve_reward, "broken_rewards_mod:f")
    assert "cannot import module 'broken_rewards_mod'" in message and "RuntimeError: boom" in message
    assert "has no attribute 'nothing'" in usage_error(data.resolve_reward, "my_rewards_mod:nothing")
    assert "is not callable (it is a 'int')" in usage_error(data.resolve_reward, "my_rewards_mod:LIMIT")
    message = usage_error(data.resolve_reward, "my_rewards_mod:two_args")
    assert "cannot be called as fn(prompt, response, answer)" in message
    assert "is not module:function" in usage_error(data.resolve_reward, "my_rewards_mod:")


def test_distinct_prompts_keep_the_first_row_per_id_and_leave_out_excluded_ids():
    from pipeline.tasks.prompts import Prompt, distinct

    rows = [{"id": "a", "prompt": "p1", "answer": "x"}, {"id": "b", "prompt": "p2", "answer": "y"},
            {"id": "a", "prompt": "other", "answer": "z"}, {"id": "c", "prompt": "p3", "answer": "w"}]
    assert distinct(rows) == [Prompt("a", "p1", "x"), Prompt("b", "p2", "y"), Prompt("c", "p3", "w")]
    assert [p.id for p in distinct(rows, exclude={"b"})] == ["a", "c"]


def test_train_size_keeps_a_data_sets_first_rows_and_sizes_a_task(tmp_path):
    from pipeline.config.schema import DataConfig
    from pipeline.tasks.prompts import TASK_TRAIN_SIZE, train_rows

    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"p{i}", "answer": str(i)}) + "\n"
                            for i in range(5)))
    user = DataConfig(task=None, path=str(path))
    assert len(train_rows(user)) == 5  # null: every row
    three = train_rows(DataConfig(task=None, path=str(path), train_size=3))
    assert list(three["prompt"]) == ["p0", "p1", "p2"]
    assert len(train_rows(DataConfig(task=None, path=str(path), train_size=9))) == 5
    assert len(train_rows(DataConfig(task="sort"))) == TASK_TRAIN_SIZE
    assert len(train_rows(DataConfig(task="sort", train_size=7))) == 7
