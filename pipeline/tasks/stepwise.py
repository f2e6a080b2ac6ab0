"""Shared machinery of the digit-string tasks that answer with a step-by-step trace.

A prompt is `<verb> <digits>:` and a response is `step|step|...|ans <digits>`: one step
per input digit, then the answer. The concrete tasks (sort, reverse) only say what a step
looks like and when a step is valid; generation, parsing and scoring live here so that the
tasks score alike.

Reward, for a response (the text after the prompt, surrounding whitespace ignored):
  - format gate, 0.0: the response is not exactly `(step|)*ans <digits>`, has more steps
    than the input has digits, or is much longer than the reference solution (runaway
    repetition). Text after the answer fails the gate: the answer must end the response.
  - 1.0 iff the final answer equals the reference answer, whatever the steps say: the
    reward is an outcome reward, the steps only shape credit for wrong answers.
  - otherwise 0.0, or with partial credit
        0.5 * valid_steps / n_digits + 0.5 * matching_positions / max(len(ans), len(ref))
    which is < 1 for every wrong answer, so partial credit never ties with a correct one.
"""

from __future__ import annotations

import random
import re
from abc import abstractmethod
from dataclasses import dataclass

from pipeline.errors import UsageError
from pipeline.tasks.base import Task, prompt_id

# Character classes are spelled out: `\d` would accept non-ASCII digits such as "٣".
_ANSWER = re.compile(r"ans ([0-9]*)")
DIGITS = "0123456789"

# A response longer than this many times its reference (plus slack for a short prompt) is
# runaway repetition; checking it first also keeps parsing cheap on huge responses.
RUNAWAY_FACTOR = 2
RUNAWAY_SLACK_CHARS = 16


@dataclass(frozen=True)
class Trace:
    """A response that passed the format gate: its steps (texts between `|`) and answer."""

    steps: list[str]
    answer: str


class DigitStepTask(Task):
    """Base of the step-trace tasks; subclasses set `name`, `verb`, `step_pattern`, the hooks.

    `max_digits`: the longest input. `decay`: P(n digits) is proportional to decay**n on
    1..max_digits, so short inputs are common and long ones rare; the solution length grows
    quadratically with n, which makes response lengths long-tailed across prompts.
    """

    verb: str  # the word that starts a prompt
    step_pattern: re.Pattern[str]

    def __init__(self, max_digits: int = 12, decay: float = 0.8) -> None:
        if not 1 <= max_digits <= 64:
            raise UsageError(f"max_digits is {max_digits}; use a value from 1 to 64")
        if not 0.0 < decay <= 1.0:
            raise UsageError(f"decay is {decay}; use a value in (0, 1]")
        self.max_digits = max_digits
        self.decay = decay

    # -- what a concrete task defines -------------------------------------------------

    @abstractmethod
    def reference_steps(self, digits: str) -> list[str]:
        """The steps of the reference trace for input `digits`, one per digit."""

    @abstractmethod
    def reference_answer(self, digits: str) -> str:
        """The final answer for input `digits`."""

    @abstractmethod
    def step_is_valid(self, digits: str, index: int, previous: str, step: str) -> bool:
        """Whether step `index` (0-based) follows from `previous` (the step before it as
        written, "" for the first) and the input alone, without the reference trace."""

    # -- generation -------------------------------------------------------------------

    def make_prompt(self, digits: str) -> str:
        return f"{self.verb} {digits}:"

    def solution(self, digits: str) -> str:
        """The reference response: every step followed by `|`, then `ans <answer>`."""
        return "".join(s + "|" for s in self.reference_steps(digits)) + "ans " + self.reference_answer(digits)

    def sample_length(self, rng: random.Random) -> int:
        lengths = range(1, self.max_digits + 1)
        return rng.choices(lengths, weights=[self.decay**k for k in lengths])[0]

    def generate(self, n: int, seed: int) -> list[dict[str, str]]:
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise UsageError(f"number of rows is {n!r}; use a positive integer")
        rng = random.Random(seed)
        rows = []
        for _ in range(n):
            digits = "".join(rng.choice(DIGITS) for _ in range(self.sample_length(rng)))
            prompt = self.make_prompt(digits)
            rows.append(
                {
                    "id": prompt_id(prompt),
                    "prompt": prompt,
                    "answer": self.reference_answer(digits),
                    "solution": self.solution(digits),
                }
            )
        return rows

    # -- scoring ----------------------------------------------------------------------

    def parse_prompt(self, prompt: str) -> str:
        """The input digits of `prompt`; its last line must end with `<verb> <digits>:`.

        Anything before that is ignored, so a chat template or few-shot prefix still works.
        A prompt of another task is a configuration error (wrong reward for the data set).
        """
        match = re.search(rf"(?:^|\s){re.escape(self.verb)} ([0-9]+):\s*$", prompt)
        if match is None:
            raise UsageError(
                f"prompt {prompt[-40:]!r} is not a {self.name!r} prompt "
                f"(like {self.make_prompt('230')!r}); use the reward that matches the data set"
            )
        return match.group(1)

    def parse_response(self, digits: str, response: str) -> Trace | None:
        """The trace of `response`, or None when it fails the format gate."""
        limit = RUNAWAY_FACTOR * len(self.solution(digits)) + RUNAWAY_SLACK_CHARS
        if len(response) > limit:
            return None
        *steps, last = response.strip().split("|")
        answer = _ANSWER.fullmatch(last)
        if answer is None or len(steps) > len(digits):
            return None
        if not all(self.step_pattern.fullmatch(step) for step in steps):
            return None
        return Trace(steps, answer.group(1))

    def is_correct(self, prompt: str, response: str, answer: str) -> bool:
        trace = self.parse_response(self.parse_prompt(prompt), response)
        return trace is not None and trace.answer == answer.strip()

    def reward(self, prompt: str, response: str, answer: str, partial_credit: bool = False) -> float:
        digits = self.parse_prompt(prompt)
        trace = self.parse_response(digits, response)
        if trace is None:
            return 0.0
        target = answer.strip()
        if trace.answer == target:
            return 1.0
        if not partial_credit:
            return 0.0
        return 0.5 * self.step_fraction(digits, trace.steps) + 0.5 * element_accuracy(trace.answer, target)

    def step_fraction(self, digits: str, steps: list[str]) -> float:
        """Valid steps over the number of input digits (missing steps count as invalid)."""
        previous, valid = "", 0
        for index, step in enumerate(steps):
            valid += self.step_is_valid(digits, index, previous, step)
            previous = step
        return valid / len(digits)


def element_accuracy(got: str, want: str) -> float:
    """Position-wise matches over the longer length, in [0, 1]; 1 iff got == want."""
    longest = max(len(got), len(want))
    if longest == 0:
        return 1.0
    return sum(a == b for a, b in zip(got, want)) / longest
