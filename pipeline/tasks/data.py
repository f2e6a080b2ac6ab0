"""Data sets on HuggingFace `datasets`: built-in task data, user data, reward functions.

Every data set the trainer sees has the str columns `id`, `prompt`, `answer` (built-in task
data also has `solution`). Every bad input raises UsageError with a one-line message that
names the config key to fix (`data.path`, `data.prompt_key`, ...).
"""

from __future__ import annotations

import functools
import importlib
import inspect
import json
from pathlib import Path
from typing import Any, Callable

import datasets
import pyarrow.parquet as pq

from pipeline.atomic import write_atomic
from pipeline.errors import UsageError
from pipeline.tasks.base import RewardFn, did_you_mean, get_task, prompt_id, task_names

SUPPORTED_SUFFIXES = (".jsonl", ".json", ".parquet")
# Suffixes that mark a missing path as a file the user meant, not a hub name.
_FILE_SUFFIXES = SUPPORTED_SUFFIXES + (".csv", ".tsv", ".txt", ".arrow", ".gz", ".zip")


def _one_line(exc: BaseException) -> str:
    """The first line of an exception's message, so a UsageError stays one line."""
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0] if lines else ''}"[:300]


# -- built-in task data ----------------------------------------------------------------


def build_task_dataset(task_name: str, n: int, seed: int) -> datasets.Dataset:
    """`n` rows of a built-in task (columns id, prompt, answer, solution), same for a seed."""
    return datasets.Dataset.from_list(get_task(task_name).generate(n, seed))


def save_dataset(ds: datasets.Dataset, path: str | Path) -> Path:
    """Write `ds` as one parquet file; readers see the old file or the new one, never half."""
    path = Path(path)
    if path.suffix != ".parquet":
        raise UsageError(f"data set file {str(path)!r} must end in .parquet")
    # pyarrow directly: `Dataset.to_parquet` draws a progress bar on stderr for every write.
    table = ds.with_format("arrow")[:]  # honours an indices mapping left by select/shuffle
    return write_atomic(path, lambda tmp: pq.write_table(table, tmp))


def load_dataset_file(path: str | Path) -> datasets.Dataset:
    """Read a parquet file written by `save_dataset` (held in memory; no cache files)."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise UsageError(f"data.path {str(path)!r} does not exist; check data.path")
    try:
        return datasets.Dataset(pq.read_table(path))
    except Exception as exc:  # pyarrow raises several types for a corrupt file
        raise UsageError(
            f"cannot read parquet file {str(path)!r} ({_one_line(exc)}); check data.path"
        ) from exc


# -- user data -------------------------------------------------------------------------


def load_user_dataset(
    path_or_name: str, split: str = "train", prompt_key: str = "prompt", answer_key: str = "answer"
) -> datasets.Dataset:
    """Load a user data set and normalise it to the columns id, prompt, answer (all str).

    `path_or_name`: a .jsonl/.json/.parquet file, a folder written by `save_to_disk`, or
    else a HuggingFace hub name (loaded with `split`). `id` is kept from the data when
    present, else it is `prompt_id(prompt)`. Other columns are dropped.
    """
    columns = _read_columns(path_or_name, split)
    return _normalise(columns, path_or_name, prompt_key, answer_key)


def _read_columns(source: str, split: str) -> dict[str, list[Any]]:
    """The data as {column: values}; missing values in JSON rows are None."""
    path = Path(source).expanduser()
    if path.is_dir():
        return _dataset_columns(_load_from_disk(path, split))
    if path.is_file():
        suffix = path.suffix.lower()
        if suffix == ".parquet":
            return _dataset_columns(load_dataset_file(path))
        if suffix in (".jsonl", ".json"):
            return _json_columns(path)
        raise UsageError(
            f"data.path {source!r} has unsupported extension {path.suffix!r}; "
            f"use one of {', '.join(SUPPORTED_SUFFIXES)} or a folder written by save_to_disk"
        )
    if source.startswith(("/", ".", "~")) or path.suffix.lower() in _FILE_SUFFIXES:
        raise UsageError(f"data.path {source!r} does not exist; check data.path")
    try:
        return _dataset_columns(datasets.load_dataset(source, split=split))
    except Exception as exc:  # the hub raises many types (network, auth, missing split)
        raise UsageError(
            f"data.path {source!r} is not a local path and loading it from the hub with "
            f"split {split!r} failed ({_one_line(exc)}); check data.path and data.split"
        ) from exc


def _load_from_disk(path: Path, split: str) -> datasets.Dataset:
    try:
        loaded = datasets.load_from_disk(str(path))
    except Exception as exc:  # a folder that is not a saved data set
        raise UsageError(
            f"data.path {str(path)!r} is a folder but not a data set written by save_to_disk "
            f"({_one_line(exc)}); check data.path"
        ) from exc
    if isinstance(loaded, datasets.DatasetDict):
        if split not in loaded:
            raise UsageError(
                f"data set {str(path)!r} has no split {split!r} (splits: {', '.join(loaded)}); set data.split"
            )
        return loaded[split]
    return loaded


def _dataset_columns(ds: datasets.Dataset) -> dict[str, list[Any]]:
    return {name: list(ds[name]) for name in ds.column_names}


def _json_columns(path: Path) -> dict[str, list[Any]]:
    """Rows of a JSON array of objects, a JSON object of columns, or JSON lines."""
    text = path.read_text(encoding="utf-8")
    if path.suffix.lower() == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError:
            data = None  # many ".json" files are JSON lines; parse them as such below
        if isinstance(data, dict) and all(isinstance(v, list) for v in data.values()):
            if len({len(v) for v in data.values()}) > 1:
                raise UsageError(f"the columns of {str(path)!r} have different lengths; fix the file")
            return data
        if isinstance(data, list):
            return _rows_to_columns(data, path, "item")
    rows = []
    for number, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise UsageError(
                    f"line {number} of {str(path)!r} is not valid JSON ({exc.msg}); fix the file"
                ) from exc
    return _rows_to_columns(rows, path, "line")


def _rows_to_columns(rows: list[Any], path: Path, unit: str) -> dict[str, list[Any]]:
    names: dict[str, None] = {}  # an ordered set: the union of keys, in order of appearance
    for number, row in enumerate(rows, start=1):
        if not isinstance(row, dict):
            raise UsageError(f"{unit} {number} of {str(path)!r} is not a JSON object; fix the file")
        names.update(dict.fromkeys(row))
    return {name: [row.get(name) for row in rows] for name in names}


def _normalise(
    columns: dict[str, list[Any]], source: str, prompt_key: str, answer_key: str
) -> datasets.Dataset:
    n_rows = max((len(values) for values in columns.values()), default=0)
    if n_rows == 0:
        raise UsageError(f"data set {source!r} has no rows; point data.path at a non-empty data set")
    present = ", ".join(columns)
    if prompt_key not in columns:
        raise UsageError(
            f"data set {source!r} has no prompt column {prompt_key!r} (columns: {present}); "
            f"set data.prompt_key"
        )
    if answer_key not in columns:
        raise UsageError(
            f"data set {source!r} has no answer column {answer_key!r} (columns: {present}); "
            f"set data.answer_key"
        )
    prompts = columns[prompt_key]
    empty = [i for i, p in enumerate(prompts) if p is None or (isinstance(p, str) and not p.strip())]
    if empty:
        raise UsageError(
            f"{len(empty)} of {n_rows} rows of {source!r} have an empty prompt (first at row {empty[0]}); "
            f"remove them or set data.prompt_key"
        )
    bad = next((i for i, p in enumerate(prompts) if not isinstance(p, str)), None)
    if bad is not None:
        raise UsageError(
            f"prompt column {prompt_key!r} of {source!r} holds {type(prompts[bad]).__name__} "
            f"values, not text (row {bad}); set data.prompt_key to a text column"
        )
    answers = ["" if a is None else str(a) for a in columns[answer_key]]
    given_ids = columns.get("id", [None] * n_rows)
    ids = [prompt_id(p) if i is None else str(i) for p, i in zip(prompts, given_ids)]
    return datasets.Dataset.from_dict({"id": ids, "prompt": prompts, "answer": answers})


# -- reward functions ------------------------------------------------------------------


def resolve_reward(spec: str, partial_credit: bool = False) -> RewardFn:
    """The reward `fn(prompt, response, answer) -> float` named by `spec`.

    `spec` is a built-in reward (`gsm8k`, `math`: `pipeline.tasks.math_rewards`), a built-in
    task name (its reward), both with `partial_credit` bound, or `module:function` (a dotted attribute path after the colon is allowed).
    """
    if ":" not in spec:
        from pipeline.tasks.math_rewards import REWARDS

        if spec in REWARDS:
            return functools.partial(REWARDS[spec][0], partial_credit=partial_credit)
        if spec in task_names():
            return functools.partial(get_task(spec).reward, partial_credit=partial_credit)
        names = task_names()
        raise UsageError(
            f"unknown reward {spec!r};{did_you_mean(spec, sorted(REWARDS) + names)} use a "
            f"built-in reward ({', '.join(sorted(REWARDS))}), a built-in task "
            f"({', '.join(names)}) or module:function"
        )
    module_name, _, attr_path = spec.partition(":")
    if not module_name or not attr_path:
        raise UsageError(f"reward {spec!r} is not module:function; write it like my_pkg.rewards:score")
    try:
        target: Any = importlib.import_module(module_name)
    except Exception as exc:  # ImportError, or anything the module raises while importing
        raise UsageError(
            f"cannot import module {module_name!r} for reward {spec!r} ({_one_line(exc)}); "
            f"check the name and that it is on PYTHONPATH"
        ) from exc
    for part in attr_path.split("."):
        if not hasattr(target, part):
            raise UsageError(f"module {module_name!r} has no attribute {attr_path!r}; check reward {spec!r}")
        target = getattr(target, part)
    if not callable(target):
        raise UsageError(
            f"reward {spec!r} is not callable (it is a {type(target).__name__!r}); point it at a function"
        )
    _check_signature(target, spec)
    return target


def _check_signature(fn: Callable[..., Any], spec: str) -> None:
    """Fail now, not mid-run, when `fn` cannot be called as fn(prompt, response, answer)."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # some builtins have no signature; trust them
        return
    try:
        signature.bind("prompt", "response", "answer")
    except TypeError as exc:
        raise UsageError(
            f"reward {spec!r} cannot be called as fn(prompt, response, answer) ({exc}); fix its parameters"
        ) from exc
