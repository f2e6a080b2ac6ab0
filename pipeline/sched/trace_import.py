"""Rollout dumps from other systems as length traces: CSV, JSONL or parquet, with a
column mapping, and lengths either given or counted from response texts by a tokenizer.

A mapping names the file's column for each role (`--trace-columns`):

    group=prompt_id,length=response_length[,epoch=step]     lengths given
    group=prompt_id,text=response[,epoch=step]               texts, counted by --tokenizer

group (the prompt id; rows of one prompt and epoch form a GRPO group) and epoch are
optional: without a group every row is a prompt of its own, without an epoch every row is
in epoch 0. Earlier epochs are the history the length predictor learns from (`rhymectl
profile --trace` scores it on the next epoch). Without a mapping a file must have a
`length` column and a group column (`group`, `group_id` or `prompt_id`).
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Iterator, Mapping

from pipeline.errors import UsageError

GROUP_KEYS = ("group", "group_id", "prompt_id")
ROLES = ("group", "length", "text", "epoch")
FORMATS = (".csv", ".jsonl", ".parquet")
Row = tuple[int, dict]  # (1-based row number, {role: value})


def parse_columns(text: str) -> dict[str, str]:
    """'group=prompt_id,length=response_length' -> {"group": "prompt_id", ...}."""
    out: dict[str, str] = {}
    for part in (p.strip() for p in text.split(",") if p.strip()):
        role, sep, column = (s.strip() for s in part.partition("="))
        if not sep or not role or not column:
            raise UsageError(f"--trace-columns: {part!r} is not ROLE=COLUMN; example: "
                             f"group=prompt_id,length=response_length")
        if role not in ROLES:
            raise UsageError(f"--trace-columns: unknown role {role!r}; roles are {', '.join(ROLES)}")
        if role in out:
            raise UsageError(f"--trace-columns: role {role!r} is mapped twice")
        out[role] = column
    if ("length" in out) == ("text" in out):
        raise UsageError("--trace-columns must map exactly one of length=COLUMN (token counts) or "
                         "text=COLUMN (response texts, counted with --tokenizer)")
    return out


def rows(path: Path, columns: Mapping[str, str] | None, tokenizer: str | None) -> Iterator[Row]:
    """The file's rows with their values under role names (group, length, epoch)."""
    suffix = path.suffix.lower()
    raw = {".csv": _csv_rows, ".jsonl": _jsonl_rows, ".parquet": _parquet_rows}[suffix](path)
    header, body = next(raw)
    _check_header(path, header, columns)
    if columns is None:
        for number, row in body:
            group = next((row[k] for k in GROUP_KEYS if row.get(k) not in (None, "")), None)
            yield number, {"group": group, "length": row.get("length"), "epoch": row.get("epoch")}
        return
    mapped = ((n, {role: row.get(col) for role, col in columns.items()}) for n, row in body)
    if "group" not in columns:
        mapped = ((n, {**r, "group": f"row{n}"}) for n, r in mapped)
    if "text" in columns:
        mapped = _count_tokens(path, list(mapped), tokenizer)
    elif tokenizer is not None:
        raise UsageError("--tokenizer counts response texts: map one with --trace-columns "
                         "text=COLUMN, or drop --tokenizer when the trace has lengths")
    yield from mapped


def _check_header(path: Path, header: list[str] | None, columns: Mapping[str, str] | None) -> None:
    if header is None:  # JSONL: keys are checked row by row
        return
    if columns is None:
        if "length" not in header or not set(GROUP_KEYS) & set(header):
            raise UsageError(f"trace file {path}: the header must name a group column ('group', "
                             f"'group_id' or 'prompt_id') and 'length'; it has {header} (or map "
                             f"yours with --trace-columns group=COL,length=COL)")
        return
    missing = [c for c in columns.values() if c not in header]
    if missing:
        raise UsageError(f"trace file {path}: no column {missing[0]!r} (mapped by --trace-columns); "
                         f"it has {header}")


def _count_tokens(path: Path, mapped: list[Row], tokenizer: str | None) -> Iterator[Row]:
    if tokenizer is None:
        raise UsageError("--trace-columns maps response texts (text=COLUMN): give --tokenizer "
                         "MODEL_DIR (a Hugging Face tokenizer) to count their tokens")
    for number, row in mapped:
        if not isinstance(row.get("text"), str):
            raise UsageError(f"trace file {path} row {number}: the text column holds "
                             f"{type(row.get('text')).__name__}, not a string")
    tok = _load_tokenizer(tokenizer)
    texts = [row["text"] for _, row in mapped]
    counts = [len(ids) for ids in tok(texts, add_special_tokens=False)["input_ids"]] if texts else []
    for (number, row), count in zip(mapped, counts):
        yield number, {**row, "length": count}


def _load_tokenizer(name: str):
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(name)
    except (OSError, ValueError) as exc:
        raise UsageError(f"--tokenizer {name}: cannot load a tokenizer there "
                         f"({str(exc).splitlines()[0]}); give a model directory with tokenizer files") from None


def _csv_rows(path: Path):
    with open(path, newline="") as fh:
        reader = csv.DictReader(fh)
        fields = [f.strip() for f in reader.fieldnames or []]
        reader.fieldnames = fields
        yield fields, ((number, {k: (v.strip() if isinstance(v, str) else v) for k, v in row.items()})
                       for number, row in enumerate(reader, start=1))
        return


def _jsonl_rows(path: Path):
    def body():
        with open(path) as fh:
            for number, line in enumerate(fh, start=1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError:
                    raise UsageError(f"trace file {path} row {number}: not valid JSON") from None
                if not isinstance(row, dict):
                    raise UsageError(f"trace file {path} row {number}: expected an object like "
                                     f'{{"group": "p1", "length": 42}}')
                yield number, row

    yield None, body()


def _parquet_rows(path: Path):
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except Exception as exc:  # pyarrow raises several types for a damaged file
        raise UsageError(f"trace file {path}: not a readable parquet file "
                         f"({str(exc).splitlines()[0]})") from None
    yield list(table.column_names), enumerate(table.to_pylist(), start=1)


__all__ = ["FORMATS", "GROUP_KEYS", "ROLES", "parse_columns", "rows"]
