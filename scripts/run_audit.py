"""What a run directory holds, row by row, to compare an interrupted run with an
uninterrupted one (`scripts/kill_trials.py`, and the engine tests of fault points and
multi-node runs, which import it from here).

A snapshot keeps what a resumed run must reproduce and drops what it cannot: wall-clock
seconds (`gen_seconds`, `time_*`, `*_s`, rates per second).
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq


def _timeless(row: dict) -> dict:
    return {k: v for k, v in row.items()
            if not (k.startswith("time_") or k.endswith("_s") or k.endswith("_per_s")
                    or k == "gen_seconds")}


def _jsonl(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def snapshot(run_dir: str | Path) -> dict:
    """{"history": [row...] by step then as written, "metrics": [...], "eval": [...]}."""
    run_dir = Path(run_dir)
    history = []
    for path in sorted((run_dir / "history").glob("step-*.parquet")):
        history += [_timeless(r) for r in pq.read_table(path).to_pylist()]
    return {"history": history,
            "metrics": [_timeless(r) for r in _jsonl(run_dir / "metrics.jsonl")],
            "eval": [_timeless(r) for r in _jsonl(run_dir / "eval.jsonl")]}


def _keys(snap: dict) -> dict[str, list]:
    """The identity of each row: (step, prompt, sample) for history, step for the logs."""
    return {"history": [(r["step"], r["prompt_id"], r["sample_index"]) for r in snap["history"]],
            "metrics": [r["step"] for r in snap["metrics"]],
            "eval": [r["step"] for r in snap["eval"]]}


def compare(reference: dict, got: dict, *, exact: bool) -> dict[str, dict[str, int]]:
    """Per file: rows lost (in the reference, not here), duplicated, extra, and (exact)
    rows whose contents differ. All zeros: nothing lost or corrupted."""
    out = {}
    ref_keys, got_keys = _keys(reference), _keys(got)
    for name in ("history", "metrics", "eval"):
        want, have = Counter(ref_keys[name]), Counter(got_keys[name])
        report = {"lost": sum((want - have).values()),
                  "duplicated": sum(n - 1 for n in have.values() if n > 1),
                  "extra": sum(1 for k in have if k not in want)}
        if exact:
            report["differ"] = sum(a != b for a, b in zip(reference[name], got[name])) + \
                abs(len(reference[name]) - len(got[name]))
        out[name] = report
    return out


def problems(report: dict) -> int:
    """Rows lost, duplicated, extra or different, over all files."""
    return sum(sum(v.values()) for v in report.values())
