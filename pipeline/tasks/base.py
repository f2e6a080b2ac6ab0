"""The task contract and the registry of built-in tasks.

A task is a verifiable problem family: it generates prompts with reference answers and
solutions (for the SFT warm-up) and scores a sampled response with a reward in [0, 1].
Tasks are stateless; `get_task(name)` returns a fresh instance with default settings.
"""

from __future__ import annotations

import difflib
import hashlib
from abc import ABC, abstractmethod
from typing import Callable, TypeVar

from pipeline.errors import UsageError

ID_HEX_CHARS = 12


def prompt_id(prompt: str) -> str:
    """Stable id of a prompt: the first 12 hex digits of sha1(prompt, utf-8).

    The id depends on the prompt text only, so a prompt keeps its id across epochs, splits
    and processes, which is what the history store keys responses by.
    """
    return hashlib.sha1(prompt.encode("utf-8")).hexdigest()[:ID_HEX_CHARS]


class Task(ABC):
    """A built-in verifiable task.

    Rows from `generate` are dicts with str values:
      id        prompt_id(prompt)
      prompt    the text the policy continues; ends with ":"
      answer    the exact final answer
      solution  the full reference response (what SFT trains on), ending with the answer line
    """

    name: str = ""

    @abstractmethod
    def generate(self, n: int, seed: int) -> list[dict[str, str]]:
        """`n` rows, the same for the same (n, seed); a prompt may repeat (same id)."""

    @abstractmethod
    def reward(self, prompt: str, response: str, answer: str, partial_credit: bool = False) -> float:
        """Score in [0, 1] of `response` (the text after `prompt`); never raises on `response`.

        Exactly 1.0 iff `is_correct`; with partial_credit=False it is 0.0 otherwise.
        """

    @abstractmethod
    def is_correct(self, prompt: str, response: str, answer: str) -> bool:
        """True iff the response passes the format checks and its final answer is `answer`."""


_TASKS: dict[str, type[Task]] = {}
T = TypeVar("T", bound=type[Task])


def register_task(cls: T) -> T:
    """Class decorator: make `cls` reachable as `get_task(cls.name)`."""
    if not cls.name:
        raise ValueError(f"{cls.__qualname__} has no name")
    if cls.name in _TASKS and _TASKS[cls.name] is not cls:
        raise ValueError(f"two tasks are named {cls.name!r}")
    _TASKS[cls.name] = cls
    return cls


def task_names() -> list[str]:
    """Names of the registered tasks, sorted."""
    return sorted(_TASKS)


def did_you_mean(name: str, choices: list[str]) -> str:
    """' did you mean 'x'?' for the closest choice, or '' when none is close."""
    close = difflib.get_close_matches(name, choices, n=1)
    return f" did you mean {close[0]!r}?" if close else ""


def get_task(name: str) -> Task:
    """A fresh instance of the task called `name`; UsageError naming the valid ones if unknown."""
    cls = _TASKS.get(name)
    if cls is None:
        names = task_names()
        raise UsageError(
            f"unknown task {name!r};{did_you_mean(name, names)} valid tasks: {', '.join(names)}"
        )
    return cls()


RewardFn = Callable[[str, str, str], float]
