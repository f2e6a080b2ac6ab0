"""The history index: a compact, persistent copy of each prompt's last K epochs of responses.

The drafter needs, per prompt, the response token ids of the prompt's last K epochs. Reading
them from the history store means scanning every step file at each resume; the index keeps
just those rows, derived from the store and refreshed incrementally after each checkpoint:

    RUN_DIR/index/history.parquet   prompt_id, prompt_hash, epoch, step, reward, response_ids
    RUN_DIR/index/meta.json         format, fingerprint, history_epochs, last_step, rows,
                                    tokens, sources, sha256 and bytes of history.parquet

The parquet file is written first, then meta.json, each atomically. The parquet file also
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

import fcntl
import hashlib
import json
import sys
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterator, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from pipeline.atomic import write_atomic, write_json_atomic
from pipeline.faults import fault
from pipeline.errors import UsageError
from pipeline.history.store import HistoryStore

FORMAT = 1
INDEX_DIR = "index"  # under the run directory
SCHEMA = pa.schema([
    ("prompt_id", pa.string()),
    ("prompt_hash", pa.string()),
    ("epoch", pa.int32()),
    ("step", pa.int32()),
    ("reward", pa.float32()),
    ("response_ids", pa.list_(pa.int32())),
])
TOKENIZER_FILES = ("merges.txt", "special_tokens_map.json", "tokenizer.json", "tokenizer.model",
                   "tokenizer_config.json", "vocab.json", "vocab.txt")
VOLATILE_CONFIG_KEYS = ("transformers_version", "torch_dtype", "dtype", "_name_or_path")
_META_KEY = b"rhymectl.index"
_CHUNK_TOKENS = 1 << 30  # int32 list offsets: keep each row group's tokens well below 2**31
# Bytes per response and per prompt besides the int32 tokens, as `responses(as_arrays=True)`
# holds them: an int32 array view, its (epoch, ids, reward) tuple, the float and the list slot;
# per prompt, the 16-hex key, its list and a dict slot. Measured, not guessed.
_PER_RESPONSE = (sys.getsizeof(np.empty(0, np.int32)[:0]) + sys.getsizeof((0, None, 0.0))
                 + sys.getsizeof(0.0) + 8)
_PER_PROMPT = sys.getsizeof("0" * 16) + sys.getsizeof([]) + 8 * 3


class _Row(NamedTuple):
    prompt_id: str
    prompt_hash: str
    epoch: int
    step: int
    reward: float
    ids: np.ndarray  # int32


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

    def __init__(self, rows: list[_Row], stats: IndexStats):
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


# ------------------------------------------------------------------ fingerprint

def fingerprint(model_dir: str | Path) -> dict[str, str]:
    """{"tokenizer": 16 hex, "model": 16 hex} of a Hugging-Face model directory."""
    d = Path(model_dir)
    hint = "point model.path (or --model) at a local Hugging-Face model directory"
    if not d.is_dir():
        raise UsageError(f"model directory {d} does not exist; {hint}")
    found = [name for name in sorted(TOKENIZER_FILES) if (d / name).is_file()]
    if not found:
        raise UsageError(f"model directory {d} has no tokenizer file ({', '.join(TOKENIZER_FILES)}); "
                         f"{hint}")
    if not (d / "config.json").is_file():
        raise UsageError(f"model directory {d} has no config.json; {hint}")
    tok = hashlib.sha256()
    for name in found:
        data = (d / name).read_bytes()
        tok.update(name.encode() + b"\0" + len(data).to_bytes(8, "little") + data)
    try:
        config = json.loads((d / "config.json").read_text())
    except (OSError, ValueError) as exc:
        raise UsageError(f"{d / 'config.json'} is not valid JSON ({_first_line(exc)}); {hint}") from None
    model = hashlib.sha256(json.dumps(_strip_volatile(config), sort_keys=True).encode())
    return {"tokenizer": tok.hexdigest()[:16], "model": model.hexdigest()[:16]}


def _strip_volatile(node):
    if isinstance(node, dict):
        return {k: _strip_volatile(v) for k, v in node.items() if k not in VOLATILE_CONFIG_KEYS}
    if isinstance(node, list):
        return [_strip_volatile(v) for v in node]
    return node


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
    with _locked(index_dir, exclusive=True):
        for stray in index_dir.glob(".*.tmp"):
            stray.unlink(missing_ok=True)  # a write that crashed before its rename
        rows, meta, reason, warning = [], None, None, None
        if not (index_dir / "meta.json").exists() and not (index_dir / "history.parquet").exists():
            reason = "new index"
        elif rebuild:
            try:
                meta, _ = _open(run_dir)
                reason = "requested"
                if meta["fingerprint"] != fp:
                    warning = _mismatch(run_dir, meta["fingerprint"], model_dir, fp)
                    reason = "fingerprint changed"
            except UsageError as exc:
                reason = f"corrupt index ({getattr(exc, 'reason', exc)})"
        else:
            meta, table = _open(run_dir, fp, model_dir)
            if meta["history_epochs"] != history_epochs:
                reason = f"history_epochs changed ({meta['history_epochs']} -> {history_epochs})"
            else:
                reason = _rewritten(meta, store)
            if reason is None:
                rows = _rows(table)
        sources = {} if reason else {s[0]: s for s in meta["sources"]}
        new_steps = [s for s in store.steps() if reason or s > meta["last_step"]]
        if not new_steps:
            return _stats(index_dir, rows, meta, store, steps_read=0)
        by_prompt: dict[str, list[_Row]] = {}
        for r in rows:
            by_prompt.setdefault(r.prompt_id, []).append(r)
        for step in new_steps:
            sources[step] = _source(store, step)
            touched = set()
            for rec in store.read_step(step):
                by_prompt.setdefault(rec.prompt_id, []).append(_Row(
                    rec.prompt_id, rec.prompt_hash, rec.epoch, rec.step, rec.reward,
                    np.asarray(rec.response_ids, dtype=np.int32)))
                touched.add(rec.prompt_id)
            for pid in touched:  # keeping the last K epochs step by step = over all of them
                by_prompt[pid] = _last_epochs(by_prompt[pid], history_epochs)
        rows = [r for pid in sorted(by_prompt) for r in sorted(by_prompt[pid], key=lambda r: r.epoch)]
        meta = {"format": FORMAT, "fingerprint": fp, "history_epochs": history_epochs,
                "last_step": new_steps[-1], "rows": len(rows),
                "tokens": int(sum(len(r.ids) for r in rows)),
                "sources": [list(sources[s]) for s in sorted(sources)]}
        meta.update(_write(index_dir, rows, meta))
    return _stats(index_dir, rows, meta, store, steps_read=len(new_steps), rebuilt=reason,
                  warning=warning)


def _last_epochs(rows: list[_Row], k: int) -> list[_Row]:
    epochs = sorted({r.epoch for r in rows})
    if len(epochs) <= k:
        return rows
    keep = set(epochs[-k:])
    return [r for r in rows if r.epoch in keep]


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


def _write(index_dir: Path, rows: list[_Row], meta: dict) -> dict:
    """Write history.parquet, then meta.json; returns the sha256 and file_bytes entries."""
    schema = SCHEMA.with_metadata({_META_KEY: json.dumps(meta, sort_keys=True).encode()})
    path = index_dir / "history.parquet"

    def write(tmp: Path) -> None:
        with pq.ParquetWriter(tmp, schema) as writer:
            for chunk in _chunks(rows):
                writer.write_table(_table(chunk, schema), row_group_size=max(len(chunk), 1))
        fault("mid_index_build", path)

    write_atomic(path, write)
    extra = {"sha256": _sha256(path), "file_bytes": path.stat().st_size}
    write_json_atomic(index_dir / "meta.json", {**meta, **extra})
    return extra


def _chunks(rows: list[_Row]) -> Iterator[list[_Row]]:
    start, tokens = 0, 0
    for i, r in enumerate(rows):
        if tokens + len(r.ids) > _CHUNK_TOKENS and i > start:
            yield rows[start:i]
            start, tokens = i, 0
        tokens += len(r.ids)
    yield rows[start:]


def _table(rows: list[_Row], schema: pa.Schema) -> pa.Table:
    lengths = np.fromiter((len(r.ids) for r in rows), dtype=np.int64, count=len(rows))
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    values = np.concatenate([r.ids for r in rows]) if rows else np.empty(0, np.int32)
    return pa.Table.from_arrays([
        pa.array([r.prompt_id for r in rows], pa.string()),
        pa.array([r.prompt_hash for r in rows], pa.string()),
        pa.array(np.array([r.epoch for r in rows], dtype=np.int32)),
        pa.array(np.array([r.step for r in rows], dtype=np.int32)),
        pa.array(np.array([r.reward for r in rows], dtype=np.float32)),
        pa.ListArray.from_arrays(pa.array(offsets), pa.array(values.astype(np.int32, copy=False))),
    ], schema=schema)


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
    with _locked(index_dir, exclusive=False):
        meta, table = _open(run_dir, fp, model_dir)
    rows = _rows(table)
    if history_epochs is not None and history_epochs < meta["history_epochs"]:
        by_prompt: dict[str, list[_Row]] = {}
        for r in rows:
            by_prompt.setdefault(r.prompt_id, []).append(r)
        rows = [r for pid in by_prompt for r in _last_epochs(by_prompt[pid], history_epochs)]
        meta = {**meta, "history_epochs": history_epochs}
    return HistoryIndex(rows, _stats(index_dir, rows, meta, HistoryStore(run_dir, readonly=True)))


class _Corrupt(UsageError):
    def __init__(self, run_dir: Path, reason: str):
        self.reason = reason
        super().__init__(f"history index {run_dir / 'index'} is corrupt or truncated ({reason}): "
                         f"rebuild it with `rhymectl index build {run_dir} --rebuild`")


def _mismatch(run_dir: Path, built: dict, model_dir, fp: dict) -> str:
    return (f"history index {run_dir / 'index'} was built for tokenizer {built.get('tokenizer')}, "
            f"model {built.get('model')} but {model_dir} has tokenizer {fp['tokenizer']}, model "
            f"{fp['model']}: rebuild it with `rhymectl index build {run_dir} --rebuild` (or point "
            f"model.path at the model it was built for)")


_META_TYPES = {"format": int, "fingerprint": dict, "history_epochs": int, "last_step": int,
               "rows": int, "tokens": int, "sources": list, "sha256": str, "file_bytes": int}


def _open(run_dir: Path, fp: dict | None = None, model_dir=None) -> tuple[dict, pa.Table]:
    """meta.json and the table, every check passed; _Corrupt or the mismatch error if not."""
    index_dir = run_dir / INDEX_DIR
    try:
        meta = json.loads((index_dir / "meta.json").read_text())
    except (OSError, ValueError) as exc:
        raise _Corrupt(run_dir, f"meta.json unreadable: {_first_line(exc)}") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        got = meta.get("format") if isinstance(meta, dict) else type(meta).__name__
        raise _Corrupt(run_dir, f"meta.json format {got}, expected {FORMAT}")
    for key, kind in _META_TYPES.items():
        if not isinstance(meta.get(key), kind):
            raise _Corrupt(run_dir, f"meta.json has no valid {key}")
    if fp is not None and meta["fingerprint"] != fp:
        raise UsageError(_mismatch(run_dir, meta["fingerprint"], model_dir, fp))
    path = index_dir / "history.parquet"
    if not path.is_file():
        raise _Corrupt(run_dir, "history.parquet missing")
    if path.stat().st_size != meta["file_bytes"]:
        raise _Corrupt(run_dir, f"history.parquet is {path.stat().st_size} bytes, meta.json "
                                f"says {meta['file_bytes']}")
    if _sha256(path) != meta["sha256"]:
        raise _Corrupt(run_dir, "sha256 of history.parquet differs from meta.json")
    try:
        table = pq.read_table(path)
    except (pa.ArrowException, OSError) as exc:
        raise _Corrupt(run_dir, f"history.parquet unreadable: {_first_line(exc)}") from None
    if not table.schema.equals(SCHEMA, check_metadata=False):
        raise _Corrupt(run_dir, "unexpected columns or types in history.parquet")
    core = {k: v for k, v in meta.items() if k not in ("sha256", "file_bytes")}
    try:
        embedded = json.loads((table.schema.metadata or {}).get(_META_KEY, b"null"))
    except ValueError:
        embedded = None
    if embedded != core:
        raise _Corrupt(run_dir, "meta.json does not match history.parquet")
    if table.num_rows != meta["rows"] or any(c.null_count for c in table.columns):
        raise _Corrupt(run_dir, f"history.parquet holds {table.num_rows} rows (nulls "
                                f"{sum(c.null_count for c in table.columns)}), meta.json says "
                                f"{meta['rows']}")
    tokens = pc.sum(pc.list_value_length(table["response_ids"])).as_py() or 0
    if tokens != meta["tokens"]:
        raise _Corrupt(run_dir, f"history.parquet holds {tokens} tokens, meta.json says "
                                f"{meta['tokens']}")
    return meta, table


def _rows(table: pa.Table) -> list[_Row]:
    cols = table.select(["prompt_id", "prompt_hash", "epoch", "step", "reward"]).to_pydict()
    ids = table["response_ids"]
    lengths = pc.list_value_length(ids).to_numpy(zero_copy_only=False).astype(np.int64)
    values = pc.list_flatten(ids).to_numpy(zero_copy_only=False).astype(np.int32, copy=False)
    ends = np.cumsum(lengths)
    names: dict[str, str] = {}  # one string object per prompt, not per row
    return [_Row(names.setdefault(pid, pid), names.setdefault(ph, ph), epoch, step, reward,
                 values[end - n:end])
            for pid, ph, epoch, step, reward, n, end in zip(
                cols["prompt_id"], cols["prompt_hash"], cols["epoch"], cols["step"],
                cols["reward"], lengths.tolist(), ends.tolist())]


# ------------------------------------------------------------------ helpers

def _stats(index_dir: Path, rows: list[_Row], meta: dict, store: HistoryStore,
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


@contextmanager
def _locked(index_dir: Path, *, exclusive: bool):
    """flock on index/.lock: one writer; readers wait for a write to finish. A reader
    never creates the folder, so it takes no lock where there is no lock file."""
    lock = index_dir / ".lock"
    if exclusive:
        index_dir.mkdir(parents=True, exist_ok=True)
        lock.touch()
    elif not lock.is_file():
        yield
        return
    with open(lock, "rb") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _first_line(exc: BaseException) -> str:
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


__all__ = ["HistoryIndex", "IndexStats", "build", "fingerprint", "load"]
