"""The history index on disk (`pipeline.history.index` builds and loads it): the parquet
schema, the write (parquet first, then meta.json, each atomic), every check a load makes
before trusting the files, the tokenizer/architecture fingerprint and the lock.

    RUN_DIR/index/history.parquet   prompt_id, prompt_hash, epoch, step, reward, response_ids
    RUN_DIR/index/meta.json         format, fingerprint, history_epochs, last_step, rows,
                                    tokens, sources, sha256 and bytes of history.parquet
    RUN_DIR/index/.lock             flock: one writer; readers wait for a write to finish
"""

from __future__ import annotations

import fcntl
import hashlib
import json
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from pipeline.atomic import write_atomic, write_json_atomic
from pipeline.errors import UsageError
from pipeline.faults import fault

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
META_KEY = b"rhymectl.index"
# Tokens per row group: well below 2**31 (int32 list offsets), and small enough that a read
# of a few prompts' rows (`pipeline.history.index.fetch`, rows sorted by prompt key) decodes
# little besides them: 4M tokens, 16 MB.
CHUNK_TOKENS = 1 << 22


class Row(NamedTuple):
    prompt_id: str
    prompt_hash: str
    epoch: int
    step: int
    reward: float
    ids: np.ndarray  # int32


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


def write(index_dir: Path, rows: list[Row], meta: dict) -> dict:
    """Write history.parquet, then meta.json; returns the sha256 and file_bytes entries."""
    schema = SCHEMA.with_metadata({META_KEY: json.dumps(meta, sort_keys=True).encode()})
    path = index_dir / "history.parquet"

    def write_parquet(tmp: Path) -> None:
        with pq.ParquetWriter(tmp, schema) as writer:
            for chunk in _chunks(rows):
                writer.write_table(_table(chunk, schema), row_group_size=max(len(chunk), 1))
        fault("mid_index_build", path)

    write_atomic(path, write_parquet)
    extra = {"sha256": _sha256(path), "file_bytes": path.stat().st_size}
    write_json_atomic(index_dir / "meta.json", {**meta, **extra})
    return extra


def _chunks(rows: list[Row]) -> Iterator[list[Row]]:
    start, tokens = 0, 0
    for i, r in enumerate(rows):
        if tokens + len(r.ids) > CHUNK_TOKENS and i > start:
            yield rows[start:i]
            start, tokens = i, 0
        tokens += len(r.ids)
    yield rows[start:]


def _table(rows: list[Row], schema: pa.Schema) -> pa.Table:
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


class Corrupt(UsageError):
    def __init__(self, run_dir: Path, reason: str):
        self.reason = reason
        super().__init__(f"history index {run_dir / 'index'} is corrupt or truncated ({reason}): "
                         f"rebuild it with `rhymectl index build {run_dir} --rebuild`")


def mismatch(run_dir: Path, built: dict, model_dir, fp: dict) -> str:
    return (f"history index {run_dir / 'index'} was built for tokenizer {built.get('tokenizer')}, "
            f"model {built.get('model')} but {model_dir} has tokenizer {fp['tokenizer']}, model "
            f"{fp['model']}: rebuild it with `rhymectl index build {run_dir} --rebuild` (or point "
            f"model.path at the model it was built for)")
META_TYPES = {"format": int, "fingerprint": dict, "history_epochs": int, "last_step": int,
               "rows": int, "tokens": int, "sources": list, "sha256": str, "file_bytes": int}


def _meta(run_dir: Path, fp: dict | None = None, model_dir=None) -> dict:
    """meta.json, checked for its format, keys and types (and fingerprint, if given)."""
    index_dir = run_dir / INDEX_DIR
    try:
        meta = json.loads((index_dir / "meta.json").read_text())
    except (OSError, ValueError) as exc:
        raise Corrupt(run_dir, f"meta.json unreadable: {_first_line(exc)}") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        got = meta.get("format") if isinstance(meta, dict) else type(meta).__name__
        raise Corrupt(run_dir, f"meta.json format {got}, expected {FORMAT}")
    for key, kind in META_TYPES.items():
        if not isinstance(meta.get(key), kind):
            raise Corrupt(run_dir, f"meta.json has no valid {key}")
    if fp is not None and meta["fingerprint"] != fp:
        raise UsageError(mismatch(run_dir, meta["fingerprint"], model_dir, fp))
    path = index_dir / "history.parquet"
    if not path.is_file():
        raise Corrupt(run_dir, "history.parquet missing")
    if path.stat().st_size != meta["file_bytes"]:
        raise Corrupt(run_dir, f"history.parquet is {path.stat().st_size} bytes, meta.json "
                                f"says {meta['file_bytes']}")
    return meta


def _check_embedded(run_dir: Path, meta: dict, schema: pa.Schema) -> None:
    if not schema.equals(SCHEMA, check_metadata=False):
        raise Corrupt(run_dir, "unexpected columns or types in history.parquet")
    core = {k: v for k, v in meta.items() if k not in ("sha256", "file_bytes")}
    try:
        embedded = json.loads((schema.metadata or {}).get(META_KEY, b"null"))
    except ValueError:
        embedded = None
    if embedded != core:
        raise Corrupt(run_dir, "meta.json does not match history.parquet")


def footer_checked(run_dir: Path) -> tuple[dict, pq.ParquetFile]:
    """meta.json and the opened history.parquet, the checks that need no full read passed
    (meta.json's own, the file size, the footer's copy of meta.json)."""
    meta = _meta(run_dir)
    try:
        pf = pq.ParquetFile(run_dir / INDEX_DIR / "history.parquet")
    except (pa.ArrowException, OSError) as exc:
        raise Corrupt(run_dir, f"history.parquet unreadable: {_first_line(exc)}") from None
    _check_embedded(run_dir, meta, pf.schema_arrow)
    return meta, pf


def checked(run_dir: Path, fp: dict | None = None, model_dir=None) -> dict:
    """meta.json, against the model and the file's sha256 and footer, without reading the
    rows (what a resume checks before the drafter reads row groups: `index.fetch`)."""
    meta = _meta(run_dir, fp, model_dir)
    if _sha256(run_dir / INDEX_DIR / "history.parquet") != meta["sha256"]:
        raise Corrupt(run_dir, "sha256 of history.parquet differs from meta.json")
    footer_checked(run_dir)
    return meta


def verified(run_dir: Path, fp: dict | None = None, model_dir=None) -> tuple[dict, pa.Table]:
    """meta.json and the table, every check passed; Corrupt or the mismatch error if not."""
    meta = _meta(run_dir, fp, model_dir)
    path = run_dir / INDEX_DIR / "history.parquet"
    if _sha256(path) != meta["sha256"]:
        raise Corrupt(run_dir, "sha256 of history.parquet differs from meta.json")
    try:
        table = pq.read_table(path)
    except (pa.ArrowException, OSError) as exc:
        raise Corrupt(run_dir, f"history.parquet unreadable: {_first_line(exc)}") from None
    _check_embedded(run_dir, meta, table.schema)
    if table.num_rows != meta["rows"] or any(c.null_count for c in table.columns):
        raise Corrupt(run_dir, f"history.parquet holds {table.num_rows} rows (nulls "
                                f"{sum(c.null_count for c in table.columns)}), meta.json says "
                                f"{meta['rows']}")
    tokens = pc.sum(pc.list_value_length(table["response_ids"])).as_py() or 0
    if tokens != meta["tokens"]:
        raise Corrupt(run_dir, f"history.parquet holds {tokens} tokens, meta.json says "
                                f"{meta['tokens']}")
    return meta, table


def rows_of(table: pa.Table) -> list[Row]:
    cols = table.select(["prompt_id", "prompt_hash", "epoch", "step", "reward"]).to_pydict()
    ids = table["response_ids"]
    lengths = pc.list_value_length(ids).to_numpy(zero_copy_only=False).astype(np.int64)
    values = pc.list_flatten(ids).to_numpy(zero_copy_only=False).astype(np.int32, copy=False)
    ends = np.cumsum(lengths)
    names: dict[str, str] = {}  # one string object per prompt, not per row
    return [Row(names.setdefault(pid, pid), names.setdefault(ph, ph), epoch, step, reward,
                 values[end - n:end])
            for pid, ph, epoch, step, reward, n, end in zip(
                cols["prompt_id"], cols["prompt_hash"], cols["epoch"], cols["step"],
                cols["reward"], lengths.tolist(), ends.tolist())]


@contextmanager
def locked(index_dir: Path, *, exclusive: bool):
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


__all__ = ["Corrupt", "FORMAT", "INDEX_DIR", "Row", "SCHEMA", "fingerprint", "footer_checked",
           "locked", "mismatch", "rows_of", "verified", "write"]
