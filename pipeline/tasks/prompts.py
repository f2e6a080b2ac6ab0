"""The one Prompt loader: the rows of the configured data set (a built-in task's generated
prompts or the user's file) as distinct `Prompt`s, for training and for held-out evaluation.

A row is a mapping with "id", "prompt" and "answer" (`pipeline.tasks.data` builds both kinds
that way). A generated task may repeat a prompt; each id counts once, first row wins.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping

from pipeline.config.schema import DataConfig
from pipeline.tasks.data import build_task_dataset, load_user_dataset

EVAL_SEED_OFFSET = 7919  # held-out prompts of a built-in task come from another seed


@dataclass(frozen=True)
class Prompt:
    id: str
    text: str
    answer: str


def distinct(rows: Iterable[Mapping], exclude: frozenset[str] | set[str] = frozenset()
             ) -> list[Prompt]:
    """One Prompt per id, in first-seen order, leaving out the ids in `exclude`."""
    seen: dict[str, Prompt] = {}
    for row in rows:
        if row["id"] not in exclude:
            seen.setdefault(row["id"], Prompt(row["id"], row["prompt"], row["answer"]))
    return list(seen.values())


TASK_TRAIN_SIZE = 256  # prompts a built-in task generates when data.train_size is null


def train_rows(data: DataConfig):
    """The training prompts as a `datasets.Dataset` with columns id, prompt, answer: a data
    set's first `data.train_size` rows (all without it), or that many generated ones."""
    if data.path is not None:
        rows = load_user_dataset(data.path, data.split, data.prompt_key, data.answer_key)
        if data.train_size is not None and data.train_size < len(rows):
            rows = rows.select(range(data.train_size))
        return rows
    return build_task_dataset(data.task, data.train_size or TASK_TRAIN_SIZE, data.seed)


def eval_prompts(data: DataConfig, train_ids: set[str]) -> list[Prompt]:
    """Built-in task: fresh prompts never trained on; user data: `data.eval_path`, if set."""
    if data.path is not None:
        if data.eval_path is None:
            return []
        rows = load_user_dataset(data.eval_path, data.split, data.prompt_key, data.answer_key)
    else:
        rows = build_task_dataset(data.task, data.eval_size * 3, data.seed + EVAL_SEED_OFFSET)
    return distinct(rows, exclude=train_ids)[: data.eval_size]


__all__ = ["Prompt", "TASK_TRAIN_SIZE", "distinct", "eval_prompts", "train_rows"]
