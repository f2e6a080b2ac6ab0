"""Built-in rewards for math data sets, selected as `data.reward: gsm8k | math`.

Both are `fn(prompt, response, answer, partial_credit=False) -> float` in [0, 1], like the
built-in tasks' rewards, and never raise on a response.

gsm8k: the final answer is the number after the last `####` (GSM8K's own convention, which
  the reference column also uses: "...\\n#### 72"); a response without `####` is scored by
  its last number. Numbers compare as exact decimals after dropping thousands separators,
  a leading currency sign and a trailing `%` or unit word ("$1,080.00" == "1080").
math: the final answer is the content of the last `\\boxed{...}` (nesting allowed; the
  reference may be a bare answer or a full MATH solution with its own box). Equivalence is
  decided by `math-verify` (symbolic: 1/2 == 0.5 == \\frac{1}{2}, sets, intervals, units
  text), not by hand-written LaTeX normalisation.

Format gate (as in the built-in tasks), 0.0: an empty response, one longer than
MAX_RESPONSE_CHARS (runaway repetition; also bounds the parser's work), or no extractable
final answer. Otherwise 1.0 iff the answer is equivalent to the reference, else 0.0, or
FORMAT_CREDIT with partial credit: a well-formed wrong answer beats no answer, and never
ties with a right one.
"""

from __future__ import annotations

import functools
import itertools
import re
import threading
from decimal import Decimal, InvalidOperation
from typing import Callable

MAX_RESPONSE_CHARS = 32_000
FORMAT_CREDIT = 0.1
# Seconds math-verify may spend parsing or comparing one expression (pathological LaTeX),
# then once more with the longer limit: a host busy with the engine and the trainer can
# take the first limit over math-verify's first parse of a kind (its grammar warms up
# lazily), and a right answer must not score 0 for the machine's load. An expression that
# times out both times scores as unparsed and is not cached, so it is tried afresh later.
VERIFY_TIMEOUT_S = 5
VERIFY_RETRY_TIMEOUT_S = 30

# ASCII digits only (`\d` would take "٣"); "1,234.5", "-3", ".5" and "12." (sentence end).
_NUMBER = re.compile(r"-?(?:[0-9][0-9,]*(?:\.[0-9]+)?|\.[0-9]+)")
_HASHES = "####"


# -- GSM8K ----------------------------------------------------------------------------


def gsm8k_number(text: str) -> Decimal | None:
    """The final answer of a GSM8K text: the first number after the last `####`, else the
    last number in the text; None when there is none."""
    if _HASHES in text:
        found = _NUMBER.search(text.rsplit(_HASHES, 1)[1])
    else:
        found = None
        for found in _NUMBER.finditer(text):
            pass
    if found is None:
        return None
    digits = found.group(0).replace(",", "")
    try:
        return Decimal(digits)
    except InvalidOperation:  # e.g. "-" followed by commas only
        return None


def gsm8k_reward(prompt: str, response: str, answer: str, partial_credit: bool = False) -> float:
    if not _passes_gate(response):
        return 0.0
    got = gsm8k_number(response)
    if got is None:
        return 0.0
    want = gsm8k_number(answer)
    if want is not None and got == want:
        return 1.0
    return FORMAT_CREDIT if partial_credit else 0.0


def gsm8k_answer_ok(answer: str) -> bool:
    """A reference the reward can use (checked for every row before a run starts)."""
    return gsm8k_number(answer) is not None


# -- MATH -----------------------------------------------------------------------------


def last_boxed(text: str) -> str | None:
    """Content of the last `\\boxed{...}` (or `\\fbox{...}`, `\\boxed 5`), braces balanced;
    None when there is no box or its braces never close."""
    start = max((text.rfind(k), k) for k in ("\\boxed", "\\fbox"))
    if start[0] < 0:
        return None
    rest = text[start[0] + len(start[1]):]
    if rest.startswith(" ") and not rest.lstrip().startswith("{"):
        word = rest.split()
        return word[0].rstrip("$.") if word else None  # `\boxed 5`
    rest = rest.lstrip()
    if not rest.startswith("{"):
        return None
    depth = 0
    for i, ch in enumerate(rest):
        depth += (ch == "{") - (ch == "}")
        if depth == 0:
            return rest[1:i].strip()
    return None


def math_reward(prompt: str, response: str, answer: str, partial_credit: bool = False) -> float:
    if not _passes_gate(response):
        return 0.0
    got = last_boxed(response)
    if not got:
        return 0.0
    gold = _parse(_reference(answer))
    pred = _parse(got)
    if gold and pred and _verify(gold, pred):
        return 1.0
    return FORMAT_CREDIT if partial_credit else 0.0


def math_answer_ok(answer: str) -> bool:
    return bool(_reference(answer).strip())


def _reference(answer: str) -> str:
    """A MATH reference: the boxed part of a full solution, else the answer as given."""
    boxed = last_boxed(answer)
    return boxed if boxed is not None else answer.strip()


def _timeouts() -> tuple[int | None, ...]:
    # math-verify's timeout is signal.alarm, which only the main thread may set.
    if threading.current_thread() is threading.main_thread():
        return (VERIFY_TIMEOUT_S, VERIFY_RETRY_TIMEOUT_S)
    return (None,)


class _TimedOut(Exception):
    """Every limit of `_timeouts()` ran out (raised through `_parse_cached`, so not cached)."""


def _with_retry(call):
    """call(timeout) under each limit in turn; math-verify's TimeoutException (a
    BaseException) moves on to the next, any other error is a wrong answer (None)."""
    from math_verify.errors import TimeoutException

    for limit in _timeouts():
        try:
            return call(limit)
        except TimeoutException:
            continue
        except Exception:  # noqa: BLE001 — malformed LaTeX is a wrong answer, not a crash
            return None
    raise _TimedOut


def _parse(latex: str) -> tuple:
    try:
        return _parse_cached(latex)
    except _TimedOut:
        return ()


@functools.lru_cache(maxsize=4096)  # references repeat n times per step
def _parse_cached(latex: str) -> tuple:
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse

    found = _with_retry(lambda limit: parse(
        f"\\boxed{{{latex}}}", extraction_config=[LatexExtractionConfig(), ExprExtractionConfig()],
        parsing_timeout=limit, raise_on_error=True))
    return tuple(found or ())


def _verify(gold: tuple, pred: tuple) -> bool:
    """Any (gold, pred) pair equivalent, as math-verify's `verify` decides over lists; pair by
    pair so that one pair's error or timeout leaves the others to decide."""
    from math_verify import verify

    for g, p in itertools.product(gold, pred):
        try:
            if _with_retry(lambda limit: verify(g, p, timeout_seconds=limit, raise_on_error=True)):
                return True
        except _TimedOut:
            continue
    return False


# -- shared ---------------------------------------------------------------------------


def _passes_gate(response: str) -> bool:
    return bool(response.strip()) and len(response) <= MAX_RESPONSE_CHARS


RewardImpl = Callable[..., float]

# name -> (reward, check of one reference answer, what a reference must look like)
REWARDS: dict[str, tuple[RewardImpl, Callable[[str], bool], str]] = {
    "gsm8k": (gsm8k_reward, gsm8k_answer_ok, "a number, or a solution ending in '#### <number>'"),
    "math": (math_reward, math_answer_ok, "a final answer or a solution with \\boxed{...}"),
}
