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
WARMUP_SEED_OFFSET = 104_729  # and the draft model's warm-up prompts from a third


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
        return fresh_prompts(data.task, data.eval_size, data.seed + EVAL_SEED_OFFSET, train_ids)
    return distinct(rows, exclude=train_ids)[: data.eval_size]


def fresh_prompts(task: str, n: int, seed: int, exclude: set[str]) -> list[Prompt]:
    """At most `n` distinct prompts of built-in `task` drawn with `seed`, none in `exclude`
    (three times as many drawn, so that repeats and excluded ones rarely leave fewer)."""
    return distinct(build_task_dataset(task, 3 * n, seed), exclude=exclude)[:n]


def warmup_prompts(data: DataConfig, n: int) -> list[Prompt]:
    """`n` prompts of the run's task that it does not train on, for the draft model's
    warm-up: a data set's rows after its first `data.train_size` (in order), or a built-in
    task's prompts of a seed of their own, none of them a training or evaluation prompt
    (not that it would change what is learnt: the draft never alters a sample);
    ValueError naming what to change where there are fewer."""
    if data.path is not None:
        rows = load_user_dataset(data.path, data.split, data.prompt_key, data.answer_key)
        first = min(data.train_size or len(rows), len(rows))
        if first + n > len(rows):
            raise ValueError(f"the data set has {len(rows)} rows, {first} of them trained on: "
                             f"ask for at most {len(rows) - first} warm-up prompts "
                             f"(spec.draft_warmup_prompts), or train on fewer (data.train_size)")
        return [Prompt(str(r["id"]), r["prompt"], r["answer"])
                for r in rows.select(range(first, first + n))]
    trained = {p.id for p in distinct(train_rows(data))}
    held_out = {p.id for p in eval_prompts(data, trained)}
    fresh = fresh_prompts(data.task, n, data.seed + WARMUP_SEED_OFFSET, trained | held_out)
    if len(fresh) < n:
        raise ValueError(f"task {data.task} gave only {len(fresh)} prompts outside the "
                         f"training set: ask for fewer warm-up prompts "
                         f"(spec.draft_warmup_prompts)")
    return fresh


__all__ = ["Prompt", "TASK_TRAIN_SIZE", "distinct", "eval_prompts", "fresh_prompts",
           "train_rows", "warmup_prompts"]
