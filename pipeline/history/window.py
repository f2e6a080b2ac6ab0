"""The drafter's history window: each prompt's responses of its last K epochs, read for
the prompts a step needs, held in memory no longer than the run's files lack them.

A run's responses reach disk step by step: rank 0 writes each step's records to the
history store (`RUN_DIR/history/step-N.parquet`) after the step, and the index
(`RUN_DIR/index`, the last K epochs of every prompt) is rebuilt from the store at each
checkpoint. `HistoryWindow.responses(keys)` merges, for the prompts asked for only:

- the index's rows of those prompts (`pipeline.history.index.fetch`: the row groups
  holding them, not the data set);
- the store's step files the index does not cover yet (their rows of those prompts);
- rows `add`ed in memory whose step has no file yet (the step just gathered: rank 0
  writes it after the drafter has been given it).

and cuts each prompt to its last K epochs (`pipeline.history.epochs.last_epochs`). Rows in
memory are dropped once their step file exists, so memory holds a step or two of records
whatever the data set's size. Without a run directory (`run_dir=None`: benches, tests,
runs that never call `attach`) memory is the only source and keeps everything added.
Prompts are keyed by `prompt_hash` of their token ids, as the store, the index and the
drafter key them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from pipeline.history.epochs import last_epochs


@dataclass(frozen=True)
class HistoryRow:
    """One response: its prompt's key, epoch, step (None: from an index, step unknown),
    int32 token ids and reward."""

    key: str
    epoch: int
    step: int | None
    ids: np.ndarray
    reward: float


def rows_of_records(records: Iterable) -> list[HistoryRow]:
    """`RolloutRecord`s (or anything with prompt_hash, epoch, step, response_ids, reward)
    as compact rows."""
    return [HistoryRow(r.prompt_hash, int(r.epoch), int(r.step),
                       np.asarray(r.response_ids, dtype=np.int32), float(r.reward))
            for r in records]


class HistoryWindow:
    """The last `k` epochs of responses per prompt, for the prompts asked for."""

    def __init__(self, k: int, run_dir: str | Path | None = None):
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        self.k = k
        self.run_dir = None if run_dir is None else Path(run_dir)
        self._memory: dict[str, list[HistoryRow]] = {}

    def attach(self, run_dir: str | Path) -> None:
        """Read what memory lacks from RUN_DIR's index and history store from now on."""
        self.run_dir = Path(run_dir)
        self._trim(self._on_disk())

    def add(self, rows: Iterable[HistoryRow]) -> set[str]:
        """Rows of a step (any order); returns the prompt keys they touch."""
        touched = set()
        for r in rows:
            self._memory.setdefault(r.key, []).append(r)
            touched.add(r.key)
        return touched

    def responses(self, keys: Sequence[str]) -> dict[str, list[HistoryRow]]:
        """key -> the prompt's rows of its last k epochs, oldest epoch first (then by
        step, then as added); prompts without any row are left out."""
        keys = list(dict.fromkeys(keys))
        found: dict[str, list[HistoryRow]] = {}
        on_disk: set[int] = set()
        if self.run_dir is not None:
            from pipeline.history import index
            from pipeline.history.store import HistoryStore

            covered, indexed = index.fetch(self.run_dir, keys, self.k)
            for key, rows in indexed.items():
                found[key] = [HistoryRow(key, r.epoch, r.step, r.ids, r.reward) for r in rows]
            store = HistoryStore(self.run_dir, readonly=True)
            steps = store.steps()
            on_disk = set(steps)
            for step in steps:
                if covered is not None and step <= covered:
                    continue
                for key, epoch, s, ids, reward in store.read_prompts(step, keys):
                    found.setdefault(key, []).append(HistoryRow(key, epoch, s, ids, reward))
            self._trim(on_disk)
        for key in keys:
            for r in self._memory.get(key, ()):
                found.setdefault(key, []).append(r)
        out = {}
        for key, rows in found.items():
            rows.sort(key=lambda r: (r.epoch, -1 if r.step is None else r.step))
            out[key] = last_epochs(rows, self.k)
        return out

    def memory_tokens(self) -> int:
        """Response tokens held in memory."""
        return int(sum(len(r.ids) for rows in self._memory.values() for r in rows))

    def _on_disk(self) -> set[int]:
        from pipeline.history.store import HistoryStore

        return set(HistoryStore(self.run_dir, readonly=True).steps())

    def _trim(self, on_disk: set[int]) -> None:
        """Drop memory rows a file holds: rows of a step on disk, and an index's rows."""
        for key in list(self._memory):
            rows = [r for r in self._memory[key] if r.step is not None and r.step not in on_disk]
            if rows:
                self._memory[key] = rows
            else:
                del self._memory[key]


__all__ = ["HistoryRow", "HistoryWindow", "rows_of_records"]
