"""Trace import: CSV / JSONL / parquet with a column mapping, texts counted by a real
tokenizer, predictor scoring on a trace's epochs, and every bad trace as one line, exit 2."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import typer

from pipeline.errors import UsageError
from pipeline.sched.trace import TraceGroup, read_trace
from pipeline.sched.trace_import import parse_columns
from rhymectl import cmd_bench, cmd_profile

MAPPING = "group=prompt_id,length=response_length,epoch=step"


def cli() -> typer.Typer:
    app = typer.Typer()
    cmd_bench.register(app)
    cmd_profile.register(app)
    return app


def main(monkeypatch, capsys, *args) -> tuple[int, str, str]:
    import rhymectl.app

    monkeypatch.setattr(rhymectl.app, "app", cli())
    with pytest.raises(SystemExit) as exc:
        rhymectl.app.main(list(args))
    captured = capsys.readouterr()
    return exc.value.code, captured.out, captured.err


def dump(path, rows):
    """rows as a parquet file (columns: prompt_id, response_length, step, response)."""
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def rollout_rows(epochs=2, prompts=6, n=4):
    return [{"prompt_id": f"q{p}", "response_length": 10 * (p + 1) + s + e, "step": e,
             "response": "x" * (3 * (p + 1) + s)}
            for e in range(epochs) for p in range(prompts) for s in range(n)]


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    """A real (character-level) Hugging Face tokenizer saved to disk."""
    from pipeline.policy.tokenizer import train_char_tokenizer

    path = tmp_path_factory.mktemp("tok")
    train_char_tokenizer(["xyz hello"]).save_pretrained(path)
    return path


def test_parse_columns():
    assert parse_columns(MAPPING) == {"group": "prompt_id", "length": "response_length", "epoch": "step"}
    assert parse_columns(" text = response ") == {"text": "response"}
    for bad, message in [("group", "'group' is not ROLE=COLUMN"), ("size=x,length=y", "unknown role 'size'"),
                         ("length=a,length=b", "role 'length' is mapped twice"),
                         ("group=g", "exactly one of length=COLUMN"),
                         ("length=a,text=b", "exactly one of length=COLUMN")]:
        with pytest.raises(UsageError, match=message):
            parse_columns(bad)


def test_parquet_with_a_column_mapping(tmp_path):
    path = dump(tmp_path / "d.parquet", rollout_rows())
    trace = read_trace(path, parse_columns(MAPPING))
    assert trace.epochs() == [0, 1] and trace.requests == 48
    assert trace.groups[0] == TraceGroup("q0", 0, (10, 11, 12, 13))
    assert trace.history(1)["q5"] == {0: [60, 61, 62, 63]}


def test_jsonl_and_csv_mappings_without_group_or_epoch(tmp_path):
    jsonl = tmp_path / "d.jsonl"
    jsonl.write_text("".join(json.dumps({"len": x}) + "\n" for x in (5, 7)))
    trace = read_trace(jsonl, {"length": "len"})
    assert trace.groups == (TraceGroup("row1", 0, (5,)), TraceGroup("row2", 0, (7,)))
    csv = tmp_path / "d.csv"
    csv.write_text("pid,tokens,ep\na,3,1\na,4,1\nb,9,0\n")
    trace = read_trace(csv, parse_columns("group=pid,length=tokens,epoch=ep"))
    assert trace.groups == (TraceGroup("b", 0, (9,)), TraceGroup("a", 1, (3, 4)))


def test_response_texts_counted_by_a_real_tokenizer(tmp_path, tokenizer_dir):
    path = dump(tmp_path / "d.parquet", rollout_rows(epochs=1, prompts=2, n=2))
    trace = read_trace(path, parse_columns("group=prompt_id,text=response"), str(tokenizer_dir))
    # one token per character, no special tokens counted
    assert trace.groups == (TraceGroup("q0", 0, (3, 4)), TraceGroup("q1", 0, (6, 7)))


def test_bench_sched_replays_a_mapped_parquet_trace(tmp_path, monkeypatch, capsys):
    path = dump(tmp_path / "d.parquet", rollout_rows())
    monkeypatch.chdir(tmp_path)
    code, out, err = main(monkeypatch, capsys, "bench", "sched", "--trace", str(path), "--trace-columns",
                          MAPPING, "--workers", "3", "--simulate", "--json", "--requests-per-worker", "4")
    assert code == 0, err
    report = json.loads(out)
    assert set(report["policies"]) == {"static", "histopipe", "seer", "oracle"}
    assert report["policies"]["oracle"]["over_oracle"] == 1.0


def test_profile_scores_the_predictor_on_a_trace(tmp_path, monkeypatch, capsys):
    path = dump(tmp_path / "d.parquet", rollout_rows(epochs=3))
    monkeypatch.chdir(tmp_path)
    code, out, err = main(monkeypatch, capsys, "profile", "--trace", str(path), "--trace-columns", MAPPING,
                          "--json")
    assert code == 0, err
    errors = json.loads(out)["predictor"]["next_epoch_errors"]
    assert [e["epoch"] for e in errors] == [1, 2]
    # every prompt seen before; each epoch's mean is one token above the last
    assert errors[0]["known"] == 6 and errors[0]["mae_known"] == pytest.approx(1.0)
    assert errors[0]["spearman_known"] == pytest.approx(1.0)
    assert (tmp_path / "profile-d.png").exists()


@pytest.mark.parametrize("rows, args, expected", [
    (rollout_rows(), ["--trace-columns", "group=prompt_id,length=tokens"],
     "trace file {path}: no column 'tokens' (mapped by --trace-columns); it has "
     "['prompt_id', 'response_length', 'step', 'response']"),
    ([{"prompt_id": "a", "response_length": 0, "step": 0, "response": ""}], ["--trace-columns", MAPPING],
     "trace file {path} row 1: length 0 is not positive; lengths are generated tokens (>= 1)"),
    ([{"prompt_id": "a", "response_length": -4, "step": 0, "response": ""}], ["--trace-columns", MAPPING],
     "trace file {path} row 1: length -4 is not positive; lengths are generated tokens (>= 1)"),
    (rollout_rows(), ["--trace-columns", "group=prompt_id,text=response"],
     "--trace-columns maps response texts (text=COLUMN): give --tokenizer MODEL_DIR (a Hugging Face "
     "tokenizer) to count their tokens"),
    (rollout_rows(), ["--trace-columns", MAPPING, "--tokenizer", "somewhere"],
     "--tokenizer counts response texts: map one with --trace-columns text=COLUMN, or drop --tokenizer "
     "when the trace has lengths"),
    (rollout_rows(), ["--trace-columns", "group=prompt_id"],
     "--trace-columns must map exactly one of length=COLUMN (token counts) or text=COLUMN (response "
     "texts, counted with --tokenizer)"),
    (rollout_rows(), [], "trace file {path}: the header must name a group column ('group', 'group_id' or "
                         "'prompt_id') and 'length'; it has ['prompt_id', 'response_length', 'step', "
                         "'response'] (or map yours with --trace-columns group=COL,length=COL)"),
])
def test_bad_traces_exit_2_with_one_line(tmp_path, monkeypatch, capsys, rows, args, expected):
    path = dump(tmp_path / "d.parquet", rows)
    code, out, err = main(monkeypatch, capsys, "bench", "sched", "--trace", str(path), "--simulate", *args)
    assert (code, out) == (2, "")
    assert err == f"error: {expected.format(path=path)}\n"
    assert not list(tmp_path.glob("*.png"))  # nothing written


def test_empty_damaged_and_misplaced_traces_exit_2(tmp_path, monkeypatch, capsys):
    empty = tmp_path / "e.parquet"
    pq.write_table(pa.table({"group": pa.array([], pa.string()), "length": pa.array([], pa.int64())}), empty)
    damaged = tmp_path / "x.parquet"
    damaged.write_bytes(b"PAR1 not really")
    cases = [
        (["--trace", str(empty)], f"trace file {empty} holds no requests; give one row per request (group, length)"),
        (["--trace", str(damaged)], f"trace file {damaged}: not a readable parquet file"),
        ([str(tmp_path), "--trace-columns", MAPPING],
         "--trace-columns and --tokenizer describe a --trace FILE; give one"),
    ]
    for args, expected in cases:
        code, out, err = main(monkeypatch, capsys, "bench", "sched", *args, "--simulate")
        assert (code, out) == (2, "") and err.startswith(f"error: {expected}") and err.count("\n") == 1


def test_a_tokenizer_that_does_not_load(tmp_path, monkeypatch, capsys):
    path = dump(tmp_path / "d.parquet", rollout_rows())
    code, out, err = main(monkeypatch, capsys, "bench", "sched", "--trace", str(path), "--simulate",
                          "--trace-columns", "group=prompt_id,text=response", "--tokenizer", str(tmp_path / "none"))
    assert (code, out) == (2, "")
    assert err.startswith(f"error: --tokenizer {tmp_path / 'none'}: cannot load a tokenizer there") and err.count("\n") == 1
