"""The GSM8K- and MATH-format generators and the shipped sample_data/ they produce."""

from __future__ import annotations

import ast
import json
import operator
import re
from pathlib import Path

import pytest

from pipeline.config.schema import DataConfig
from pipeline.errors import UsageError
from pipeline.loop.preflight import check_references
from pipeline.tasks.data import resolve_reward
from pipeline.tasks.math_problems import frac, math_rows
from pipeline.tasks.math_rewards import gsm8k_reward, last_boxed, math_reward
from pipeline.tasks.prompts import eval_prompts, train_rows
from pipeline.tasks.sample_data import SAMPLES, main, sample_files, sample_split
from pipeline.tasks.word_problems import gsm8k_rows

ROOT = Path(__file__).resolve().parents[2]
SAMPLE_DIR = ROOT / "sample_data"
MATH_TYPES = {"Prealgebra", "Algebra", "Number Theory", "Counting & Probability", "Geometry",
              "Intermediate Algebra", "Precalculus"}
CALC = re.compile(r"<<([^=<>]+)=([^<>]+)>>([^ .\n]+)")
OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


def arithmetic(expr: str) -> float:
    """The value of a calculator annotation such as "3*4" (numbers and + - * / only)."""
    def value(node):
        if isinstance(node, ast.BinOp) and type(node.op) in OPS:
            return OPS[type(node.op)](value(node.left), value(node.right))
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        raise AssertionError(f"not arithmetic: {expr!r}")
    return value(ast.parse(expr, mode="eval").body)


def shipped(name: str, split: str) -> list[dict]:
    return [json.loads(line) for line in (SAMPLE_DIR / name / f"{split}.jsonl").read_text().splitlines()]


# -- the generators --------------------------------------------------------------------


@pytest.mark.parametrize("generate", [gsm8k_rows, math_rows])
def test_generators_are_deterministic_per_seed(generate):
    assert generate(50, 3) == generate(50, 3)
    assert generate(50, 3) != generate(50, 4)
    assert generate(20, 3) == generate(50, 3)[:20]
    with pytest.raises(UsageError, match="number of rows is 0; use a positive integer"):
        generate(0, 3)


def test_gsm8k_rows_have_checked_calculator_steps_and_a_final_answer():
    rows = gsm8k_rows(500, 0)
    assert len({r["question"] for r in rows}) == 500
    steps = set()
    for row in rows:
        assert list(row) == ["question", "answer"] and row["question"].endswith("?")
        *lines, last = row["answer"].split("\n")
        assert re.fullmatch(r"#### [0-9]+", last), last
        steps.add(len(lines))
        results = []
        for line in lines:
            (expr, result, shown), = CALC.findall(line)  # one annotation per step
            assert arithmetic(expr) == int(result) == int(shown), line
            results.append(result)
        assert last == f"#### {results[-1]}"  # the answer is the last step's result
    assert steps == {1, 2, 3, 4, 5}


def test_gsm8k_rows_of_chosen_steps_hold_only_those_templates():
    for steps in [(1,), (2, 5)]:
        rows = gsm8k_rows(300, 0, steps=steps)
        assert len({r["question"] for r in rows}) == 300
        assert {len(r["answer"].split("\n")) - 1 for r in rows} == set(steps)
    assert gsm8k_rows(50, 3, steps=None) == gsm8k_rows(50, 3)  # the shipped mix, unchanged
    easy = shipped("gsm8k-easy", "test")
    assert all(re.fullmatch(r"\w+ has [1-9] \w+ and gets [1-9] more\. How many \w+ does \w+ have now\?",
                            r["question"]) for r in easy)
    assert {len(r["answer"].split("\n")) for r in easy} == {2}
    with pytest.raises(UsageError, match=r"no template has \(6,\) steps; the templates have 1 to 5"):
        gsm8k_rows(5, 0, steps=(6,))


def test_math_rows_have_math_columns_and_a_boxed_answer():
    rows = math_rows(500, 0)
    assert len({r["problem"] for r in rows}) == 500
    levels = set()
    for row in rows:
        assert list(row) == ["problem", "level", "type", "solution"]
        assert row["type"] in MATH_TYPES
        assert re.fullmatch(r"Level [1-5]", row["level"])
        levels.add(row["level"])
        assert last_boxed(row["solution"]) and row["solution"].endswith("$.")
    assert levels == {f"Level {k}" for k in range(1, 6)}


def test_frac_is_in_lowest_terms():
    assert [frac(8, 10), frac(4, 2), frac(-3, 9), frac(3, -9), frac(0, 5)] == [
        "\\frac{4}{5}", "2", "-\\frac{1}{3}", "-\\frac{1}{3}", "0"]


# -- the shipped files -----------------------------------------------------------------


def test_the_shipped_files_are_what_the_generator_writes(tmp_path):
    files = sample_files()
    assert sorted(files) == ["gsm8k-easy/test.jsonl", "gsm8k-easy/train.jsonl", "gsm8k/test.jsonl",
                             "gsm8k/train.jsonl", "math/test.jsonl", "math/train.jsonl"]
    for rel, text in files.items():
        assert (SAMPLE_DIR / rel).read_text() == text, (
            f"sample_data/{rel} drifted; regenerate with `python -m pipeline.tasks.sample_data sample_data`")
    assert main([str(tmp_path)]) == 0
    for rel in files:
        assert (tmp_path / rel).read_bytes() == (SAMPLE_DIR / rel).read_bytes()
    assert sum(len(t) for t in files.values()) < 400_000  # small enough to commit


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_train_and_test_splits_are_disjoint(name):
    split = sample_split(name)
    key = SAMPLES[name][3]
    assert len(split["train"]) == SAMPLES[name][1] and len(split["test"]) == SAMPLES[name][2]
    assert not {r[key] for r in split["train"]} & {r[key] for r in split["test"]}


@pytest.mark.parametrize("name", ["gsm8k", "gsm8k-easy"])
@pytest.mark.parametrize("split", ["train", "test"])
def test_every_shipped_gsm8k_reference_scores_one(name, split):
    for row in shipped(name, split):
        assert gsm8k_reward(row["question"], row["answer"], row["answer"]) == 1.0
        wrong = re.sub(r"#### ([0-9]+)$", lambda m: f"#### {int(m.group(1)) + 1}", row["answer"])
        assert gsm8k_reward(row["question"], wrong, row["answer"], partial_credit=True) == 0.1


@pytest.mark.parametrize("split", ["train", "test"])
def test_every_shipped_math_reference_scores_one(split):
    for row in shipped("math", split):
        assert math_reward(row["problem"], row["solution"], row["solution"]) == 1.0
        wrong = row["solution"].replace("\\boxed{", "\\boxed{1000+", 1)
        assert math_reward(row["problem"], wrong, row["solution"]) == 0.0


@pytest.mark.parametrize("name, prompt_key, answer_key", [("gsm8k", "question", "answer"),
                                                          ("gsm8k-easy", "question", "answer"),
                                                          ("math", "problem", "solution")])
def test_the_loaders_take_the_sample_data_as_a_cluster_user_configures_it(name, prompt_key, answer_key):
    reward_name = name.split("-")[0]  # gsm8k-easy is scored as gsm8k
    data = DataConfig(task=None, path=str(SAMPLE_DIR / name / "train.jsonl"),
                      eval_path=str(SAMPLE_DIR / name / "test.jsonl"), prompt_key=prompt_key,
                      answer_key=answer_key, reward=reward_name, eval_size=500)
    train = train_rows(data)
    assert train.column_names == ["id", "prompt", "answer"] and len(train) == SAMPLES[name][1]
    evals = eval_prompts(data, set(train["id"]))
    assert len(evals) == SAMPLES[name][2]  # no test prompt is a train prompt
    check_references(reward_name, train, data.path)  # raises on an unusable reference
    reward = resolve_reward(reward_name, partial_credit=True)
    assert all(reward(r["prompt"], r["answer"], r["answer"]) == 1.0 for r in train)
    assert all(reward(p.text, p.answer, p.answer) == 1.0 for p in evals)
