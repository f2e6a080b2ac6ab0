"""The history index: a compact, persistent copy of each prompt's last K epochs of responses.

The drafter needs, per prompt, the response token ids of the prompt's last K epochs. Reading
them from the history store means scanning every step file at each resume; the index keeps
just those rows, derived from the store and refreshed incrementally after each checkpoint:

    RUN_DIR/index/history.parquet   prompt_id, prompt_hash, epoch, step, reward, response_ids
    RUN_DIR/index/meta.json         format, fingerprint, history_epochs, last_step, rows,
                                    tokens, sources, sha256 and bytes of history.parquet

The parquet file is written first, then meta.json, each atomically (the file format,
its checks and the lock are `pipeline.history.index_file`). The parquet file also
carries meta.json's fields (all but sha256 and file_bytes) in its schema metadata, so a
meta.json that was edited, or that belongs to another write, is detected on load.

Token ids depend only on the tokenizer and the architecture, so the fingerprint covers the
tokenizer files and config.json (less volatile keys), not the weights that every RL step
changes. `sources` records (step, bytes, mtime_ns, inode) of every step file folded in: a
refresh reads only newer step files unless history was rolled back or rewritten (resume),
in which case it rebuilds from all of them. One writer at a time (a lock file); loads take
the lock shared, so they never see parquet and meta.json of different writes.
"""

from __future__ import annotations

import sys
from bisect import bisect_left
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import pyarrow.compute as pc

from pipeline.errors import UsageError
from pipeline.history.index_file import (FORMAT, INDEX_DIR, SCHEMA, Row, checked,
                                         fingerprint, footer_checked, locked, mismatch,
                                         rows_of, verified, write)
from pipeline.history.epochs import last_epochs
from pipeline.history.store import HistoryStore

# Bytes per response and per prompt besides the int32 tokens, as `responses(as_arrays=True)`
# holds them: an int32 array view, its (epoch, ids, reward) tuple, the float and the list slot;
# per prompt, the 16-hex key, its list and a dict slot. Measured, not guessed.
_PER_RESPONSE = (sys.getsizeof(np.empty(0, np.int32)[:0]) + sys.getsizeof((0, None, 0.0))
                 + sys.getsizeof(0.0) + 8)
_PER_PROMPT = sys.getsizeof("0" * 16) + sys.getsizeof([]) + 8 * 3


@dataclass
class IndexStats:
    """What an index holds. memory_bytes: what `responses(as_arrays=True)` takes (int32
    tokens plus the measured per-response and per-prompt overheads above); the list[int]
    form takes several times more. current: history has no step newer than last_step and
    was not rolled back or rewritten (else stale_reason says what changed)."""

    path: str
    prompts: int
    responses: int
    tokens: int
    memory_bytes: int
    file_bytes: int
    fingerprint: dict[str, str]
    history_epochs: int
    last_step: int
    epochs: list[int]
    current: bool = True
    stale_steps: int = 0  # history steps newer than last_step
    stale_reason: str | None = None
    steps_read: int | None = None  # build only: history step files read
    rebuilt: str | None = None  # build only: why it rebuilt from all steps; None = incremental
    warning: str | None = None  # build only: the fingerprint changed and --rebuild replaced it

    def as_dict(self) -> dict:
        return asdict(self)


class HistoryIndex:
    """A loaded, verified index."""

    def __init__(self, rows: list[Row], stats: IndexStats):
        self._rows = rows
        self._stats = stats

    def responses(self, *, as_arrays: bool = False) -> dict[str, list[tuple[int, list[int], float]]]:
        """prompt_hash -> [(epoch, response token ids, reward)], oldest epoch first, then by
        step and order within the step. as_arrays: ids as int32 numpy views (compact)."""
        out: dict[str, list] = {}
        for r in self._rows:
            out.setdefault(r.prompt_hash, []).append(
                (r.epoch, r.ids if as_arrays else r.ids.tolist(), r.reward))
        return out

    def stats(self) -> IndexStats:
        return self._stats


# ------------------------------------------------------------------ build

def build(run_dir: str | Path, model_dir: str | Path, history_epochs: int, *,
          rebuild: bool = False) -> IndexStats:
    """Build or refresh RUN_DIR/index from RUN_DIR/history; returns what it now holds.

    Refreshes incrementally (reads only step files newer than the index) when the index is
    valid, has this fingerprint and K, and history was not rolled back or rewritten since;
    otherwise rebuilds from every step file and says why in `rebuilt`. rebuild=True always
    rebuilds, also over a corrupt index or one of another fingerprint (then `warning` says so).
    """
    run_dir = Path(run_dir)
    if history_epochs < 1:
        raise UsageError(f"history_epochs must be >= 1, got {history_epochs}")
    store = HistoryStore(run_dir, readonly=True)
    if not store.steps():
        raise UsageError(f"{run_dir} has no history ({run_dir / 'history'}/step-*.parquet); "
                         f"train at least one step first")
    fp = fingerprint(model_dir)
    index_dir = run_dir / INDEX_DIR
    with locked(index_dir, exclusive=True):
        for stray in index_dir.glob(".*.tmp"):
            stray.unlink(missing_ok=True)  # a write that crashed before its rename
        rows, meta, reason, warning = [], None, None, None
        if not (index_dir / "meta.json").exists() and not (index_dir / "history.parquet").exists():
            reason = "new index"
        elif rebuild:
            try:
                meta, _ = verified(run_dir)
                reason = "requested"
                if meta["fingerprint"] != fp:
                    warning = mismatch(run_dir, meta["fingerprint"], model_dir, fp)
                    reason = "fingerprint changed"
            except UsageError as exc:
                reason = f"corrupt index ({getattr(exc, 'reason', exc)})"
        else:
            meta, table = verified(run_dir, fp, model_dir)
            if meta["history_epochs"] != history_epochs:
                reason = f"history_epochs changed ({meta['history_epochs']} -> {history_epochs})"
            else:
                reason = _rewritten(meta, store)
            if reason is None:
                rows = rows_of(table)
        sources = {} if reason else {s[0]: s for s in meta["sources"]}
        new_steps = [s for s in store.steps() if reason or s > meta["last_step"]]
        if not new_steps:
            return _stats(index_dir, rows, meta, store, steps_read=0)
        by_prompt: dict[str, list[Row]] = {}
        for r in rows:
            by_prompt.setdefault(r.prompt_id, []).append(r)
        for step in new_steps:
            sources[step] = _source(store, step)
            touched = set()
            for rec in store.read_step(step):
                by_prompt.setdefault(rec.prompt_id, []).append(Row(
                    rec.prompt_id, rec.prompt_hash, rec.epoch, rec.step, rec.reward,
                    np.asarray(rec.response_ids, dtype=np.int32)))
                touched.add(rec.prompt_id)
            for pid in touched:  # keeping the last K epochs step by step = over all of them
                by_prompt[pid] = last_epochs(by_prompt[pid], history_epochs)
        # by prompt key, then oldest epoch first (stable: then by step and order): a read
        # of some prompts' rows (`fetch`) skips the row groups whose key range misses them
        rows = sorted((r for rs in by_prompt.values() for r in rs),
                      key=lambda r: (r.prompt_hash, r.epoch, r.step))
        meta = {"format": FORMAT, "fingerprint": fp, "history_epochs": history_epochs,
                "last_step": new_steps[-1], "rows": len(rows),
                "tokens": int(sum(len(r.ids) for r in rows)),
                "sources": [list(sources[s]) for s in sorted(sources)]}
        meta.update(write(index_dir, rows, meta))
    return _stats(index_dir, rows, meta, store, steps_read=len(new_steps), rebuilt=reason,
                  warning=warning)


def _source(store: HistoryStore, step: int) -> tuple[int, int, int, int]:
    st = store.path(step).stat()
    return (step, st.st_size, st.st_mtime_ns, st.st_ino)


def _rewritten(meta: dict, store: HistoryStore) -> str | None:
    """Why the index no longer matches history up to its last_step (None: it does)."""
    last, newest = meta["last_step"], store.last_step()
    if newest is None or newest < last:
        return f"history rolled back (index at step {last}, history at step {newest})"
    recorded = {s[0]: tuple(s) for s in meta["sources"]}
    for step in store.steps():
        if step > last:
            break
        if recorded.pop(step, None) != _source(store, step):
            return f"history rewritten (step {step})"
    if recorded:
        return f"history rewritten (step {min(recorded)} removed)"
    return None


# ------------------------------------------------------------------ load

def load(run_dir: str | Path, model_dir: str | Path | None,
         history_epochs: int | None = None) -> HistoryIndex | None:
    """The verified index of RUN_DIR, or None when it has none (fall back to live drafting).

    model_dir None skips the fingerprint check. An index of more epochs than history_epochs
    is cut to the last history_epochs per prompt; one of fewer is returned as it is (its
    stats say its K). A stale index (history moved on, rolled back or rewritten) is returned
    too, with stats().current False: drafts from it are only slower, never wrong.
    """
    run_dir = Path(run_dir)
    index_dir = run_dir / INDEX_DIR
    if not (index_dir / "meta.json").exists() and not (index_dir / "history.parquet").exists():
        return None
    fp = None if model_dir is None else fingerprint(model_dir)
    with locked(index_dir, exclusive=False):
        meta, table = verified(run_dir, fp, model_dir)
    rows = rows_of(table)
    if history_epochs is not None and history_epochs < meta["history_epochs"]:
        by_prompt: dict[str, list[Row]] = {}
        for r in rows:
            by_prompt.setdefault(r.prompt_id, []).append(r)
        rows = [r for pid in by_prompt for r in last_epochs(by_prompt[pid], history_epochs)]
        meta = {**meta, "history_epochs": history_epochs}
    return HistoryIndex(rows, _stats(index_dir, rows, meta, HistoryStore(run_dir, readonly=True)))


def check(run_dir: str | Path, model_dir: str | Path) -> bool:
    """Whether RUN_DIR has an index; Corrupt or the mismatch error (one line, exit 2) when
    it is damaged or another model's. The rows are not read (see `fetch`)."""
    run_dir = Path(run_dir)
    index_dir = run_dir / INDEX_DIR
    if not (index_dir / "meta.json").exists() and not (index_dir / "history.parquet").exists():
        return False
    with locked(index_dir, exclusive=False):
        checked(run_dir, fingerprint(model_dir), model_dir)
    return True


def fetch(run_dir: str | Path, keys: Sequence[str], history_epochs: int
          ) -> tuple[int | None, dict[str, list[Row]]]:
    """Some prompts' rows of RUN_DIR's index (keys: prompt hashes), the last
    `history_epochs` epochs of each, oldest first; and the step the index is current to.
    (None, {}) when the run has no index.

    Only the row groups whose prompt-key range holds one of `keys` are read (the index is
    sorted by key), so a step's prompts cost a few row groups, not the data set. Checked:
    meta.json and its copy in the file's footer, the file's size; the full checks (sha256,
    row and token counts) are `load`'s, made when a run resumes.
    """
    run_dir = Path(run_dir)
    index_dir = run_dir / INDEX_DIR
    if not (index_dir / "meta.json").exists():
        return None, {}
    wanted = sorted(set(keys))
    with locked(index_dir, exclusive=False):
        meta, pf = footer_checked(run_dir)
        col = pf.schema_arrow.get_field_index("prompt_hash")
        groups = []
        for g in range(pf.metadata.num_row_groups):
            stats = pf.metadata.row_group(g).column(col).statistics
            if stats is None or not stats.has_min_max:
                groups.append(g)
                continue
            i = bisect_left(wanted, stats.min)
            if i < len(wanted) and wanted[i] <= stats.max:
                groups.append(g)
        table = pf.read_row_groups(groups) if groups else SCHEMA.empty_table()
    table = table.filter(pc.field("prompt_hash").isin(wanted))
    by_key: dict[str, list[Row]] = {}
    for r in rows_of(table):
        by_key.setdefault(r.prompt_hash, []).append(r)
    return meta["last_step"], {k: last_epochs(rs, history_epochs) for k, rs in by_key.items()}


# ------------------------------------------------------------------ helpers

def _stats(index_dir: Path, rows: list[Row], meta: dict, store: HistoryStore,
           steps_read: int | None = None, rebuilt: str | None = None,
           warning: str | None = None) -> IndexStats:
    prompts = len({r.prompt_hash for r in rows})
    tokens = int(sum(len(r.ids) for r in rows))
    stale = [s for s in store.steps() if s > meta["last_step"]]
    reason = _rewritten(meta, store) or (f"{len(stale)} newer history steps" if stale else None)
    return IndexStats(
        path=str(index_dir), prompts=prompts, responses=len(rows), tokens=tokens,
        memory_bytes=4 * tokens + _PER_RESPONSE * len(rows) + _PER_PROMPT * prompts,
        file_bytes=meta["file_bytes"], fingerprint=dict(meta["fingerprint"]),
        history_epochs=meta["history_epochs"], last_step=meta["last_step"],
        epochs=sorted({r.epoch for r in rows}), current=reason is None, stale_steps=len(stale),
        stale_reason=reason, steps_read=steps_read, rebuilt=rebuilt, warning=warning)


__all__ = ["INDEX_DIR", "HistoryIndex", "IndexStats", "build", "fetch", "fingerprint", "load"]
