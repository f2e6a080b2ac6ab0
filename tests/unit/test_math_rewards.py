"""The built-in gsm8k and math rewards on real-looking responses, and their data checks.

References come from tests/data/gsm8k_sample.jsonl and math_sample.jsonl, which have the
columns of the hub data sets (GSM8K: question, answer "...#### 72"; MATH: problem, solution
with a \\boxed answer).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.tasks import math_rewards as mr
from pipeline.tasks.data import resolve_reward

DATA = Path(__file__).resolve().parent / "data"


def rows(name: str) -> list[dict]:
    return [json.loads(line) for line in (DATA / name).read_text().splitlines()]


GSM = rows("gsm8k_sample.jsonl")
MATH = rows("math_sample.jsonl")


# -- GSM8K ------------------------------------------------------------------------------


@pytest.mark.parametrize("response, row, expected", [
    ("She sold 24 in May, so 48 + 24 = 72.\n#### 72", 0, 1.0),
    ("48 + 24 = 72 clips", 0, 1.0),                                 # last number, no ####
    ("#### 72.00", 0, 1.0),                                         # same value
    ("#### 71", 0, 0.0),
    ("The answer is 72, no wait, 73", 0, 0.0),                      # the last number counts
    ("#### 72 clips, from 48 and 24", 0, 1.0),                      # first number after ####
    ("It takes in $7,200 over three weeks.", 1, 1.0),               # currency and commas
    ("#### $7200.", 1, 1.0),
    ("#### 7,20", 1, 0.0),
    ("At midnight it was -7 degrees.\n#### -7", 2, 1.0),           # negative
    ("#### 7", 2, 0.0),
    ("They need 4.5 cups.", 3, 1.0),
    ("They need 9/2 cups.", 3, 0.0),                                # 2 is the last number
    ("", 0, 0.0),                                                   # empty
    ("   \n", 0, 0.0),
    ("no number here", 0, 0.0),
])
def test_gsm8k_reward(response, row, expected):
    assert mr.gsm8k_reward(GSM[row]["question"], response, GSM[row]["answer"]) == expected


def test_gsm8k_partial_credit_is_for_a_wrong_number_only():
    q, a = GSM[0]["question"], GSM[0]["answer"]
    assert mr.gsm8k_reward(q, "#### 71", a, partial_credit=True) == mr.FORMAT_CREDIT
    assert mr.gsm8k_reward(q, "no idea", a, partial_credit=True) == 0.0
    assert mr.gsm8k_reward(q, "#### 72", a, partial_credit=True) == 1.0


def test_gsm8k_a_runaway_response_fails_the_gate():
    q, a = GSM[0]["question"], GSM[0]["answer"]
    long = "I think " * (mr.MAX_RESPONSE_CHARS // 8) + "#### 72"
    assert len(long) > mr.MAX_RESPONSE_CHARS
    assert mr.gsm8k_reward(q, long, a) == 0.0
    just_fits = "x" * (mr.MAX_RESPONSE_CHARS - 8) + " #### 72"
    assert mr.gsm8k_reward(q, just_fits, a) == 1.0


def test_gsm8k_references_of_the_fixture_are_usable():
    assert [str(mr.gsm8k_number(r["answer"])) for r in GSM] == ["72", "7200", "-7", "4.5"]
    assert not mr.gsm8k_answer_ok("see the explanation")


# -- MATH -------------------------------------------------------------------------------


@pytest.mark.parametrize("response, row, expected", [
    ("So the sum is $\\boxed{\\frac{5}{6}}$.", 0, 1.0),
    ("The sum is \\boxed{5/6}", 0, 1.0),                            # equivalent form
    ("\\boxed{\\dfrac{5}{6}}", 0, 1.0),
    ("\\boxed{0.8333}", 0, 0.0),                                    # not equal
    ("\\boxed{\\frac{1}{2}} is wrong; the sum is \\boxed{\\frac{5}{6}}", 0, 1.0),  # last box
    ("\\boxed{\\frac{5}{6}} ... actually \\boxed{1}", 0, 0.0),
    ("The answer is 5/6.", 0, 0.0),                                 # no box: format gate
    ("\\boxed{\\frac{5}{6}", 0, 0.0),                               # unbalanced braces
    ("\\boxed{\\frac{5}{}", 0, 0.0),                                # malformed LaTeX
    ("\\boxed{\\{3, 2\\}}", 1, 1.0),                                # nested braces, a set
    ("\\boxed{\\{2\\}}", 1, 0.0),
    ("\\boxed{5\\sqrt{2}}", 2, 1.0),
    ("\\boxed{\\sqrt{50}}", 2, 1.0),                                # symbolic equivalence
    ("\\boxed{5\\sqrt{3}}", 2, 0.0),
    ("\\boxed{(2,\\infty)}", 3, 1.0),                               # interval
    ("\\boxed{[2,\\infty)}", 3, 0.0),
    ("", 0, 0.0),
])
def test_math_reward(response, row, expected):
    r = MATH[row]
    assert mr.math_reward(r["problem"], response, r["solution"]) == expected


def test_math_units_and_bare_references():
    assert mr.math_reward("", "\\boxed{12\\text{ cm}}", "12") == 1.0
    assert mr.math_reward("", "\\boxed{1{,}000}", "1000") == 1.0
    assert mr.math_reward("", "\\boxed{10\\%}", "10") == 1.0
    assert mr.math_reward("", "\\boxed{x = 4}", "4") == 1.0


def test_math_partial_credit_and_long_responses():
    sol = MATH[0]["solution"]
    assert mr.math_reward("", "\\boxed{7}", sol, partial_credit=True) == mr.FORMAT_CREDIT
    assert mr.math_reward("", "no box", sol, partial_credit=True) == 0.0
    reasoning = "We add the fractions step by step. " * 200 + "\\boxed{\\frac{5}{6}}"
    assert len(reasoning) < mr.MAX_RESPONSE_CHARS and mr.math_reward("", reasoning, sol) == 1.0
    runaway = "\\frac{5}{6} " * 4000 + "\\boxed{\\frac{5}{6}}"
    assert mr.math_reward("", runaway, sol) == 0.0


@pytest.mark.parametrize("text, boxed", [
    ("\\boxed{a}", "a"),
    ("\\boxed{\\frac{a}{b}} and \\boxed{c^{2}}", "c^{2}"),
    ("\\fbox{3}", "3"),
    ("\\boxed 5$.", "5"),
    ("\\boxed{\\{1,\\{2\\}\\}}", "\\{1,\\{2\\}\\}"),
    ("\\boxed{1", None),
    ("nothing", None),
])
def test_last_boxed(text, boxed):
    assert mr.last_boxed(text) == boxed


def test_resolve_reward_builds_the_builtin_math_rewards():
    fn = resolve_reward("gsm8k", partial_credit=True)
    assert fn("q", "#### 72", GSM[0]["answer"]) == 1.0
    assert fn("q", "#### 1", GSM[0]["answer"]) == mr.FORMAT_CREDIT
    assert resolve_reward("math")("q", "\\boxed{5/6}", MATH[0]["solution"]) == 1.0


# -- a loaded host: math-verify's time limit must not turn a right answer into 0 -------------


def _slow_first(monkeypatch, name, times_out):
    """math_verify.NAME raising math-verify's TimeoutException while times_out(limit) says
    so (as on a host where the first limit runs out), else the real function."""
    import math_verify
    from math_verify.errors import TimeoutException

    real = getattr(math_verify, name)
    limits = []

    def wrapped(*args, **kwargs):
        limit = kwargs.get("parsing_timeout", kwargs.get("timeout_seconds"))
        limits.append(limit)
        if times_out(limit):
            raise TimeoutException("slow host")
        return real(*args, **kwargs)

    monkeypatch.setattr(math_verify, name, wrapped)
    mr._parse_cached.cache_clear()
    return limits


@pytest.mark.parametrize("name", ["parse", "verify"])
def test_a_timeout_at_the_first_limit_is_tried_again_with_the_longer_one(monkeypatch, name):
    limits = _slow_first(monkeypatch, name, lambda limit: limit == mr.VERIFY_TIMEOUT_S)
    r = MATH[3]
    assert mr.math_reward(r["problem"], "\\boxed{(2,\\infty)}", r["solution"]) == 1.0
    assert mr.VERIFY_RETRY_TIMEOUT_S in limits
    mr._parse_cached.cache_clear()


def test_a_reference_that_timed_out_is_not_cached_as_unparsable(monkeypatch):
    slow = [True]
    _slow_first(monkeypatch, "parse", lambda limit: slow[0])
    r = MATH[3]
    assert mr.math_reward(r["problem"], "\\boxed{(2,\\infty)}", r["solution"]) == 0.0
    slow[0] = False  # the host is quiet again: the same reference now parses
    assert mr.math_reward(r["problem"], "\\boxed{(2,\\infty)}", r["solution"]) == 1.0
    mr._parse_cached.cache_clear()
