"""Per-step training metrics: an append-only JSONL log and its one-line text form (the
CLI's live view, `rhymectl.live`, shows the same columns).

`<run_dir>/metrics.jsonl` holds one JSON object per finished RL step. A record counts as
written once its newline is on disk (one write, flush, fsync), so a crash leaves at most a
torn last line, which readers skip and the next writer cuts off. Resuming from a
checkpoint rolls the log back with `truncate_after`, the same way the history store does.

Record keys the live view and the report know (floats unless noted; any may be missing):
step (int), reward_mean, accuracy, resp_len_mean / _p90 / _max (tokens), time_<phase>_s
(wall seconds per phase; time_step_s is the whole step), gen_tokens_per_s.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Sequence

from pipeline.atomic import write_text_atomic
from pipeline.errors import UsageError

METRICS_FILE = "metrics.jsonl"

# (record key, header, format): the one list of what the live table and log lines show.
COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("step", "step", "{}"),
    ("reward_mean", "reward", "{:.3f}"),
    ("accuracy", "acc", "{:.3f}"),
    ("resp_len_mean", "len mean", "{:.1f}"),
    ("resp_len_p90", "len p90", "{:.0f}"),
    ("resp_len_max", "len max", "{:.0f}"),
    ("time_rollout_s", "rollout s", "{:.2f}"),
    ("time_reward_s", "reward s", "{:.2f}"),
    ("time_train_s", "train s", "{:.2f}"),
    ("time_sync_s", "sync s", "{:.2f}"),
    ("time_step_s", "step s", "{:.2f}"),
    ("gen_tokens_per_s", "gen tok/s", "{:.0f}"),
)


def summarize_lengths(lengths: Sequence[int]) -> dict:
    """Response lengths (tokens) -> {"mean": float, "p90": float, "max": int}.

    p90 is numpy's linear-interpolation percentile. An empty batch gives zeros, so a step
    that generated nothing still logs a record instead of failing the run.
    """
    import numpy as np

    if len(lengths) == 0:
        return {"mean": 0.0, "p90": 0.0, "max": 0}
    arr = np.asarray(lengths, dtype=np.float64)
    return {"mean": float(arr.mean()), "p90": float(np.percentile(arr, 90)),
            "max": int(arr.max())}


def _builtin(value: Any) -> Any:
    """json.dumps fallback for numpy scalars and 0-dim tensors (anything with .item())."""
    if hasattr(value, "item"):
        return value.item()
    raise TypeError(f"metric value of type {type(value).__name__} is not JSON serialisable")


class MetricsLog:
    """`<run_dir>/metrics.jsonl`, one record per step. One process writes; any may read."""

    def __init__(self, run_dir: str | Path, name: str = METRICS_FILE):
        self.path = Path(run_dir) / name
        self._tail_checked = False

    def append(self, record: dict) -> None:
        """Write one record durably (one line, flush, fsync). record must have "step"."""
        if "step" not in record:
            raise ValueError("a metrics record needs a 'step' key")
        line = json.dumps(record, default=_builtin) + "\n"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if not self._tail_checked:
            self._drop_torn_tail()
            self._tail_checked = True
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.write(line)
            fh.flush()
            os.fsync(fh.fileno())

    def read(self) -> list[dict]:
        """All complete records in file order; [] when the file does not exist yet.

        A torn last line (a crash mid-write) is skipped; a bad line anywhere else raises
        UsageError naming the file and line, since that is damage, not a crash.
        """
        if not self.path.exists():
            return []
        lines = self.path.read_text(encoding="utf-8", errors="replace").split("\n")
        records = []
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            last = number == len(lines)  # no newline after it: possibly torn
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                if last:
                    break
                raise UsageError(
                    f"{self.path} line {number} is not valid JSON ({exc.msg}); delete or fix "
                    "that line") from None
            if not isinstance(record, dict):
                if last:
                    break
                raise UsageError(f"{self.path} line {number} is not a JSON object; delete or "
                                 "fix that line")
            records.append(record)
        return records

    def truncate_after(self, step: int) -> int:
        """Keep only records with record["step"] <= step (atomic rewrite). Returns how many."""
        if not self.path.exists():
            return 0
        kept = [r for r in self.read() if r.get("step", step + 1) <= step]
        write_text_atomic(self.path, "".join(json.dumps(r) + "\n" for r in kept))
        self._tail_checked = True  # the rewrite ends with a newline
        return len(kept)

    def _drop_torn_tail(self) -> None:
        """Cut a torn last line so the next record starts on a line of its own."""
        if not self.path.exists():
            return
        with open(self.path, "rb+") as fh:
            data = fh.read()
            if not data or data.endswith(b"\n"):
                return
            tail_start = data.rfind(b"\n") + 1
            try:
                complete = isinstance(json.loads(data[tail_start:]), dict)
            except ValueError:
                complete = False
            if complete:  # written without its newline (by hand, say): keep it
                fh.write(b"\n")
            else:
                fh.truncate(tail_start)
            fh.flush()
            os.fsync(fh.fileno())


def format_value(record: dict, key: str, fmt: str) -> str:
    value = record.get(key)
    if value is None:
        return "-"
    try:
        return fmt.format(value)
    except (TypeError, ValueError):
        return str(value)


def format_line(record: dict) -> str:
    """'step 4 | reward 0.512 | acc 0.400 | ...' over COLUMNS; missing values show '-'."""
    return " | ".join(f"{header} {format_value(record, key, fmt)}" for key, header, fmt in COLUMNS)
