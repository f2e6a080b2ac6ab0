"""Response-length traces: a plain CSV/JSONL file or a run's history, and step drawing.

A trace file (CSV, JSONL or parquet; `pipeline.sched.trace_import` reads it) has one row
per request: a group id (`group`, or `group_id` / `prompt_id`), its `length` in generated
tokens, and optionally its `epoch` (default 0); other column names are mapped with
--trace-columns, and response texts can be counted by a tokenizer. Rows of one
group and epoch form a GRPO group. The last epoch is the step to replay; earlier epochs
are the history its predictions come from, so a published single-epoch trace replays with
fallback predictions only.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

import numpy as np

from pipeline.errors import UsageError, require_file
from pipeline.history.store import HistoryStore

@dataclass(frozen=True)
class TraceGroup:
    group_id: str
    epoch: int
    lengths: tuple[int, ...]


@dataclass(frozen=True)
class Trace:
    source: str
    groups: tuple[TraceGroup, ...]

    @property
    def requests(self) -> int:
        return sum(len(g.lengths) for g in self.groups)

    def epochs(self) -> list[int]:
        return sorted({g.epoch for g in self.groups})

    def step_epoch(self) -> int:
        """The epoch to replay: the newest one holding at least half as many groups as
        the fullest epoch (a run stopped early leaves a thin last epoch)."""
        counts = {e: 0 for e in self.epochs()}
        for g in self.groups:
            counts[g.epoch] += 1
        most = max(counts.values())
        return max(e for e, c in counts.items() if 2 * c >= most)

    def history(self, before_epoch: int) -> dict[str, dict[int, list[int]]]:
        """prompt_id -> epoch -> lengths over the epochs before `before_epoch` (the
        predictor's input, as `HistoryStore.lengths()` gives it)."""
        out: dict[str, dict[int, list[int]]] = {}
        for g in self.groups:
            if g.epoch < before_epoch:
                out.setdefault(g.group_id, {}).setdefault(g.epoch, []).extend(g.lengths)
        return out

    def step(self, epoch: int) -> list[TraceGroup]:
        return [g for g in self.groups if g.epoch == epoch]


def read_trace(path: str | Path, columns: Mapping[str, str] | None = None,
               tokenizer: str | None = None) -> Trace:
    """A trace file (.csv with a header row, .jsonl with one object per line, or .parquet).

    columns: role -> the file's column (`pipeline.sched.trace_import.parse_columns`);
    tokenizer: a tokenizer to count response texts with (columns maps `text`).
    """
    from pipeline.sched.trace_import import FORMATS, rows

    path = Path(path)
    require_file(path, "trace file", "pass a .csv, .jsonl or .parquet file")
    suffix = path.suffix.lower()
    if suffix not in FORMATS:
        raise UsageError(f"trace file {path}: unsupported format {suffix or 'without suffix'!r}; "
                         f"use .csv, .jsonl or .parquet (one row per request: group, length)")
    groups: dict[tuple[int, str], list[int]] = {}
    for number, row in rows(path, columns, tokenizer):
        group = row.get("group")
        if group in (None, ""):
            raise UsageError(f"trace file {path} row {number}: missing group id (column "
                             f"'group', 'group_id' or 'prompt_id')")
        length = _integer(path, number, "length", row.get("length"))
        if length < 1:
            raise UsageError(f"trace file {path} row {number}: length {length} is not positive; "
                             f"lengths are generated tokens (>= 1)")
        epoch = 0 if row.get("epoch") in (None, "") else _integer(path, number, "epoch", row["epoch"])
        groups.setdefault((epoch, str(group)), []).append(length)
    if not groups:
        raise UsageError(f"trace file {path} holds no requests; give one row per request "
                         f"(group, length)")
    return Trace(str(path), tuple(TraceGroup(gid, e, tuple(ls))
                                  for (e, gid), ls in sorted(groups.items())))


def open_history(run_dir: str | Path, hint: str):
    """The run directory's history store (read-only); UsageError ending in `hint` if empty."""

    run_dir = Path(run_dir)
    store = HistoryStore(run_dir, readonly=True)
    if not store.steps():
        raise UsageError(f"{run_dir} has no history ({run_dir / 'history'}/step-*.parquet); "
                         f"{hint}")
    return store


def trace_from_history(run_dir: str | Path) -> Trace:
    """The length trace of a run directory's history store."""
    store = open_history(run_dir, "train at least one step there, or pass --trace FILE")
    groups = [TraceGroup(pid, epoch, tuple(lengths))
              for pid, per_epoch in sorted(store.lengths().items())
              for epoch, lengths in sorted(per_epoch.items())]
    return Trace(str(run_dir), tuple(groups))


def draw_groups(groups: list[TraceGroup], requests: int, seed: int = 0) -> list[TraceGroup]:
    """Groups drawn from `groups` until they hold at least `requests` requests: shuffled
    passes over all of them (no repeat before every group was drawn once)."""
    if not groups:
        raise ValueError("no groups to draw from")
    rng = np.random.default_rng(seed)
    out, total = [], 0
    while total < requests:
        for i in rng.permutation(len(groups)):
            out.append(groups[i])
            total += len(groups[i].lengths)
            if total >= requests:
                break
    return out


def _integer(path: Path, number: int, key: str, value) -> int:
    if value is None or value == "":
        raise UsageError(f"trace file {path} row {number}: missing {key}")
    if isinstance(value, bool):
        value = repr(value)
    try:
        number_value = float(value)
    except (TypeError, ValueError):
        number_value = float("nan")
    if not number_value.is_integer():
        raise UsageError(f"trace file {path} row {number}: {key} {value!r} is not a whole number")
    return int(number_value)


__all__ = ["Trace", "TraceGroup", "draw_groups", "read_trace", "trace_from_history"]
