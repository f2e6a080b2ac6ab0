"""Durable, append-only rollout history: one parquet file per RL step.

Layout: `<run_dir>/history/step-000012.parquet`, one row per response, written with
`write_atomic` (temp file in the same folder, fsync, rename). The set of complete step
files *is* the committed history; there is no manifest to keep in sync. A crash mid-append
leaves at most a hidden `.step-….tmp` file, which readers never list and a writable store
deletes when it opens.

Why parquet files and not SQLite (WAL) or a server:
- reads are per prompt and per column: the drafter wants one prompt's response ids, the
  length predictor only (prompt_hash, epoch, length); pyarrow projects columns and filters
  rows per file without decoding the rest;
- atomic rename gives crash safety with no journal, lock or server process;
- a step file is a self-contained blob, easy to ship between ranks/nodes without a shared
  filesystem, and readable by any tool (pandas, duckdb, polars);
- resume rolls history back to a checkpoint by deleting whole files (`truncate_after`),
  where SQLite would need a DELETE plus VACUUM and one file lock for every rank.

One process writes (the rank that persists the store); others open with readonly=True,
which never touches the folder, so it is safe next to a running trainer.
"""

from __future__ import annotations

import hashlib
import re
from collections import defaultdict
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Iterator, Literal, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from pipeline.atomic import write_atomic
from pipeline.errors import UsageError
from pipeline.faults import fault
from pipeline.history.epochs import last_epochs as last_epochs_of

SCHEMA = pa.schema([
    ("prompt_id", pa.string()),
    ("prompt_hash", pa.string()),
    ("epoch", pa.int32()),
    ("step", pa.int32()),
    ("policy_version", pa.int32()),
    ("sample_index", pa.int16()),
    ("response_ids", pa.list_(pa.int32())),
    ("length", pa.int32()),
    ("finish_reason", pa.string()),
    ("reward", pa.float32()),
    ("gen_seconds", pa.float32()),
])
_STEP_FILE = re.compile(r"^step-(\d{6,})\.parquet$")


@dataclass(frozen=True)
class RolloutRecord:
    """One generated response. reward and gen_seconds (wall seconds) are stored as float32.

    sample_index: index within the prompt's group; length: generated tokens, normally
    len(response_ids); finish_reason: "stop", "length", ... as vLLM reports it.
    """

    prompt_id: str
    prompt_hash: str
    epoch: int
    step: int
    policy_version: int
    sample_index: int
    response_ids: list[int]
    length: int
    finish_reason: str
    reward: float
    gen_seconds: float


_FIELDS = [f.name for f in fields(RolloutRecord)]
assert _FIELDS == SCHEMA.names


def prompt_hash(prompt_ids: Sequence[int]) -> str:
    """Stable 16-hex-digit hash of prompt token ids (blake2b over int32 little-endian)."""
    data = np.asarray(prompt_ids, dtype="<i4").tobytes()
    return hashlib.blake2b(data, digest_size=8).hexdigest()


def _to_table(records: Sequence[RolloutRecord]) -> pa.Table:
    columns = {name: [getattr(r, name) for r in records] for name in _FIELDS}
    return pa.Table.from_pydict(columns, schema=SCHEMA)


def _to_records(table: pa.Table) -> list[RolloutRecord]:
    cols = table.select(_FIELDS).to_pydict()
    return [RolloutRecord(*row) for row in zip(*(cols[n] for n in _FIELDS))]


def _unreadable(path: Path, reason: str) -> UsageError:
    return UsageError(f"history file {path} is corrupt or truncated ({reason}): delete it, or "
                      f"rerun with --resume to roll history back to the last checkpoint")


class HistoryStore:
    """The rollout history of one run, under `<run_dir>/history/`."""

    def __init__(self, run_dir: str | Path, *, readonly: bool = False):
        self.dir = Path(run_dir) / "history"
        self.readonly = readonly
        if not readonly and self.dir.is_dir():
            for stray in self.dir.glob(".step-*.tmp"):
                stray.unlink(missing_ok=True)  # an append that crashed before its rename

    # ------------------------------------------------------------ files

    def path(self, step: int) -> Path:
        return self.dir / f"step-{step:06d}.parquet"

    def _files(self) -> dict[int, Path]:
        if not self.dir.is_dir():
            return {}
        found = {}
        for p in self.dir.iterdir():
            m = _STEP_FILE.match(p.name)
            if m:
                found[int(m.group(1))] = p
        return dict(sorted(found.items()))

    def _read(self, path: Path, columns: list[str] | None = None, filter=None) -> pa.Table:
        try:
            table = pq.read_table(path, columns=columns, filters=filter)
        except (pa.ArrowException, OSError) as exc:
            reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise _unreadable(path, reason) from exc
        expected = SCHEMA if columns is None else pa.schema([SCHEMA.field(c) for c in columns])
        if not table.schema.equals(expected):
            raise _unreadable(path, "unexpected columns or types")
        return table

    # ------------------------------------------------------------ writing

    def _check_writable(self) -> None:
        if self.readonly:
            raise ValueError(f"history store {self.dir} was opened readonly")

    def append(self, step: int, records: Sequence[RolloutRecord], *,
               overwrite: bool = False) -> Path:
        """Commit one step's records as `step-NNNNNN.parquet`; returns its path.

        Without `overwrite`, `step` must be newer than every committed step. A resumed run
        calls `truncate_after(checkpoint_step)` first, or passes overwrite=True to rewrite
        the step it is redoing.
        """
        self._check_writable()
        if step < 0:
            raise ValueError(f"step must be >= 0, got {step}")
        wrong = [r.step for r in records if r.step != step]
        if wrong:
            raise ValueError(f"append(step={step}) got records of step {wrong[0]}")
        path = self.path(step)
        last = self.last_step()
        if not overwrite and last is not None and step <= last:
            raise UsageError(f"history already holds step {last} ({self.path(last)}), cannot "
                             f"append step {step}: rerun with --resume to continue this run "
                             f"from its last checkpoint, or use a new run directory")
        table = _to_table(records)

        def write(tmp: Path) -> None:
            pq.write_table(table, tmp)
            fault("mid_history_write", path)

        return write_atomic(path, write)

    def truncate_after(self, step: int | None) -> list[int]:
        """Delete step files newer than `step` (all when None); returns the deleted steps.

        Newest first, so a crash part-way still leaves a contiguous prefix of steps.
        """
        self._check_writable()
        doomed = [s for s in self._files() if step is None or s > step]
        for s in reversed(doomed):
            self.path(s).unlink(missing_ok=True)
        return doomed

    # ------------------------------------------------------------ reading

    def steps(self) -> list[int]:
        """Committed steps, ascending."""
        return list(self._files())

    def last_step(self) -> int | None:
        steps = self.steps()
        return steps[-1] if steps else None

    def rows(self, step: int) -> int:
        """Rows of one step file, from its parquet footer (a truncated file has none)."""
        try:
            return pq.ParquetFile(self.path(step)).metadata.num_rows
        except (pa.ArrowException, OSError) as exc:
            reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise _unreadable(self.path(step), reason) from exc

    def read_step(self, step: int) -> list[RolloutRecord]:
        path = self.path(step)
        if not path.is_file():
            raise KeyError(f"history has no step {step} (steps: {self.steps()})")
        return _to_records(self._read(path))

    def iter_records(self) -> Iterator[RolloutRecord]:
        """Every record, by step then in appended order; one step file in memory at a time."""
        for path in self._files().values():
            yield from _to_records(self._read(path))

    def read_all(self) -> list[RolloutRecord]:
        return list(self.iter_records())

    def _scan(self, columns: list[str] | None = None, filter=None) -> pa.Table:
        tables = [self._read(p, columns, filter) for p in self._files().values()]
        schema = SCHEMA if columns is None else pa.schema([SCHEMA.field(c) for c in columns])
        return pa.concat_tables(tables) if tables else schema.empty_table()

    def responses(self, prompt_id: str, last_epochs: int,
                  before_epoch: int | None = None) -> list[RolloutRecord]:
        """A prompt's responses over the last `last_epochs` epochs it was seen in.

        Only epochs strictly before `before_epoch` count when it is given. Ordered by step,
        then as appended.
        """
        return self.responses_many([prompt_id], last_epochs, before_epoch).get(prompt_id, [])

    def responses_many(self, prompt_ids: Sequence[str], last_epochs: int,
                       before_epoch: int | None = None) -> dict[str, list[RolloutRecord]]:
        """`responses` for many prompts in one pass over the step files."""
        if last_epochs < 1:
            raise ValueError(f"last_epochs must be >= 1, got {last_epochs}")
        cond = pc.field("prompt_id").isin(list(prompt_ids))
        if before_epoch is not None:
            cond = cond & (pc.field("epoch") < before_epoch)
        by_prompt: dict[str, list[RolloutRecord]] = defaultdict(list)
        for rec in _to_records(self._scan(filter=cond)):
            by_prompt[rec.prompt_id].append(rec)
        return {pid: last_epochs_of(recs, last_epochs) for pid, recs in by_prompt.items()}

    def read_prompts(self, step: int, keys: Sequence[str]
                     ) -> list[tuple[str, int, int, np.ndarray, float]]:
        """One step's rows of the prompts `keys` (prompt hashes), as (prompt_hash, epoch,
        step, int32 response ids, reward), in appended order; [] when the step has no file."""
        path = self.path(step)
        if not path.is_file():
            return []
        table = self._read(path, ["prompt_hash", "epoch", "step", "reward", "response_ids"],
                           pc.field("prompt_hash").isin(list(keys)))
        ids = table["response_ids"]
        lengths = pc.list_value_length(ids).to_numpy(zero_copy_only=False).astype(np.int64)
        values = pc.list_flatten(ids).to_numpy(zero_copy_only=False).astype(np.int32)
        ends = np.cumsum(lengths)
        cols = table.select(["prompt_hash", "epoch", "step", "reward"]).to_pydict()
        return [(key, epoch, s, values[end - n:end], reward) for key, epoch, s, reward, n, end
                in zip(cols["prompt_hash"], cols["epoch"], cols["step"], cols["reward"],
                       lengths.tolist(), ends.tolist())]

    def groups_by_step(self) -> dict[int, set[tuple[str, int]]]:
        """step -> the (prompt_id, epoch) pairs it trained on, reading three columns only."""
        cols = self._scan(columns=["step", "prompt_id", "epoch"]).to_pydict()
        out: dict[int, set[tuple[str, int]]] = defaultdict(set)
        for step, pid, epoch in zip(cols["step"], cols["prompt_id"], cols["epoch"]):
            out[step].add((pid, epoch))
        return dict(out)

    def lengths(self, key: Literal["prompt_id", "prompt_hash"] = "prompt_id"
                ) -> dict[str, dict[int, list[int]]]:
        """prompt -> epoch -> response lengths (tokens), reading three columns only.
        Prompts are named by `key`: prompt_id (the data set's id, as reports and length
        traces show them) or prompt_hash (as the drafter and the placement look them up,
        `pipeline.history.lengths`)."""
        cols = self._scan(columns=[key, "epoch", "length"]).to_pydict()
        out: dict[str, dict[int, list[int]]] = defaultdict(lambda: defaultdict(list))
        for name, epoch, length in zip(cols[key], cols["epoch"], cols["length"]):
            out[name][epoch].append(length)
        return {name: dict(per_epoch) for name, per_epoch in out.items()}


__all__ = ["HistoryStore", "RolloutRecord", "SCHEMA", "prompt_hash"]
