"""Insertion sort of a digit string, one step per digit.

    prompt    sort 230:
    solution  2>2|3>23|0>023|ans 023

Step i is `<i-th input digit>><the sorted list so far>`: the digit, then the list with it
inserted. Each step copies most of the previous one, which is what a tiny model learns
first, and the trace length grows quadratically with the input, so lengths are long-tailed.
Scoring (format gate, outcome reward, partial credit) is described in `stepwise`.
"""

from __future__ import annotations

import re

from pipeline.tasks.base import register_task
from pipeline.tasks.stepwise import DigitStepTask


@register_task
class SortTask(DigitStepTask):
    """`sort <digits>:` answered by an insertion-sort trace; the answer is the sorted digits."""

    name = "sort"
    verb = "sort"
    step_pattern = re.compile(r"[0-9]>[0-9]+")

    def reference_steps(self, digits: str) -> list[str]:
        return [f"{d}>{''.join(sorted(digits[: i + 1]))}" for i, d in enumerate(digits)]

    def reference_answer(self, digits: str) -> str:
        return "".join(sorted(digits))

    def step_is_valid(self, digits: str, index: int, previous: str, step: str) -> bool:
        """The step names the next input digit and its list is the previous list (as
        written) with that digit inserted, in sorted order."""
        if index >= len(digits):
            return False
        digit, _, inserted = step.partition(">")
        before = previous.partition(">")[2]
        return digit == digits[index] and inserted == "".join(sorted(before + digit))
