"""Reversal of a digit string, one step per digit.

    prompt    rev 2301:
    solution  1|10|103|1032|ans 1032

Step k is the reversal of the last k input digits: the previous step with the next digit
from the end appended. Like `sort`, a copy-heavy trace whose length grows quadratically with
the input; scoring (format gate, outcome reward, partial credit) is described in `stepwise`.
"""

from __future__ import annotations

import re

from pipeline.tasks.base import register_task
from pipeline.tasks.stepwise import DigitStepTask


@register_task
class ReverseTask(DigitStepTask):
    """`rev <digits>:` answered by growing reversed suffixes; the answer is the reversal."""

    name = "reverse"
    verb = "rev"
    step_pattern = re.compile(r"[0-9]+")

    def reference_steps(self, digits: str) -> list[str]:
        backwards = digits[::-1]
        return [backwards[: k + 1] for k in range(len(digits))]

    def reference_answer(self, digits: str) -> str:
        return digits[::-1]

    def step_is_valid(self, digits: str, index: int, previous: str, step: str) -> bool:
        """The step is the previous step (as written) plus the next digit from the end."""
        if index >= len(digits):
            return False
        return step == previous + digits[len(digits) - 1 - index]
