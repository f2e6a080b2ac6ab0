"""Length traces: CSV/JSONL files, run histories, every bad-input message, step drawing."""

from __future__ import annotations

import json

import pytest

from pipeline.errors import UsageError
from pipeline.history.store import HistoryStore, RolloutRecord
from pipeline.bench.sched import BenchSetup, step_groups
from pipeline.sched.settings import PlacementSettings
from pipeline.sched.trace import Trace, TraceGroup, draw_groups, read_trace, trace_from_history


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return path


def message(path) -> str:
    with pytest.raises(UsageError) as exc:
        read_trace(path)
    return str(exc.value)


def test_csv_groups_rows_by_group_and_epoch(tmp_path):
    path = write(tmp_path, "t.csv", "group,length\np1,10\np2,5\np1,12\n")
    trace = read_trace(path)
    assert trace.groups == (TraceGroup("p1", 0, (10, 12)), TraceGroup("p2", 0, (5,)))
    assert trace.requests == 3 and trace.epochs() == [0] and trace.source == str(path)


def test_jsonl_with_epochs_and_prompt_id(tmp_path):
    rows = [{"prompt_id": "a", "length": 3, "epoch": 0}, {"prompt_id": "a", "length": 5, "epoch": 1},
            {"prompt_id": "b", "length": 7.0, "epoch": 1}]
    path = write(tmp_path, "t.jsonl", "".join(json.dumps(r) + "\n" for r in rows) + "\n")
    trace = read_trace(path)
    assert trace.groups == (TraceGroup("a", 0, (3,)), TraceGroup("a", 1, (5,)), TraceGroup("b", 1, (7,)))
    assert trace.history(1) == {"a": {0: [3]}}
    assert trace.step(1) == [TraceGroup("a", 1, (5,)), TraceGroup("b", 1, (7,))]


def test_the_replayed_epoch_skips_a_thin_last_epoch():
    def groups(epoch, count):
        return tuple(TraceGroup(f"p{i}", epoch, (1,)) for i in range(count))

    assert Trace("x", groups(0, 4) + groups(1, 4) + groups(2, 1)).step_epoch() == 1
    assert Trace("x", groups(0, 4) + groups(1, 4) + groups(2, 2)).step_epoch() == 2


@pytest.mark.parametrize("name, text, expected", [
    ("t.csv", "group,tokens\np,1\n", "the header must name a group column ('group', 'group_id' or "
                                     "'prompt_id') and 'length'; it has ['group', 'tokens'] (or map yours "
                                     "with --trace-columns group=COL,length=COL)"),
    ("t.csv", "group,length\np,1\np,\n", "row 2: missing length"),
    ("t.csv", "group,length\np,-3\n", "row 1: length -3 is not positive; lengths are generated tokens (>= 1)"),
    ("t.csv", "group,length\np,0\n", "row 1: length 0 is not positive; lengths are generated tokens (>= 1)"),
    ("t.csv", "group,length\np,4.5\n", "row 1: length '4.5' is not a whole number"),
    ("t.csv", "group,length\np,abc\n", "row 1: length 'abc' is not a whole number"),
    ("t.csv", "group,length\n,4\n", "row 1: missing group id (column 'group', 'group_id' or 'prompt_id')"),
    ("t.csv", "group,length\n", "holds no requests; give one row per request (group, length)"),
    ("t.jsonl", '{"group": "p", "length": 1}\n{"group": "p"\n', "row 2: not valid JSON"),
    ("t.jsonl", '[1, 2]\n', 'row 1: expected an object like {"group": "p1", "length": 42}'),
    ("t.jsonl", '{"group": "p", "length": null}\n', "row 1: missing length"),
    ("t.jsonl", '{"group": "p", "length": true}\n', "row 1: length 'True' is not a whole number"),
    ("t.jsonl", '{"group": "p", "length": 2, "epoch": "x"}\n', "row 1: epoch 'x' is not a whole number"),
    ("t.jsonl", "", "holds no requests; give one row per request (group, length)"),
])
def test_bad_trace_files_have_one_line_messages(tmp_path, name, text, expected):
    path = write(tmp_path, name, text)
    separator = ": " if expected.startswith("the header") else " "
    assert message(path) == f"trace file {path}{separator}{expected}"


def test_missing_file_and_unknown_format(tmp_path):
    assert message(tmp_path / "nope.csv") == (f"trace file {tmp_path / 'nope.csv'} does not exist; "
                                              f"pass a .csv, .jsonl or .parquet file")
    assert message(tmp_path) == f"trace file {tmp_path} is a directory; pass a .csv, .jsonl or .parquet file"
    assert message("/dev/null").startswith("trace file /dev/null is not a regular file; ")
    path = write(tmp_path, "t.txt", "p 1\n")
    assert message(path) == (f"trace file {path}: unsupported format '.txt'; use .csv, .jsonl or "
                             f".parquet (one row per request: group, length)")


def record(pid, epoch, step, i, length):
    return RolloutRecord(pid, "h", epoch, step, step, i, [1] * length, length, "stop", 0.0, 0.1)


def test_trace_from_history(tmp_path):
    store = HistoryStore(tmp_path)
    store.append(0, [record("a", 0, 0, 0, 3), record("a", 0, 0, 1, 4)])
    store.append(1, [record("a", 1, 1, 0, 5), record("b", 1, 1, 0, 6)])
    trace = trace_from_history(tmp_path)
    assert trace.groups == (TraceGroup("a", 0, (3, 4)), TraceGroup("a", 1, (5,)), TraceGroup("b", 1, (6,)))


def test_a_run_directory_without_history(tmp_path):
    with pytest.raises(UsageError) as exc:
        trace_from_history(tmp_path)
    assert str(exc.value) == (f"{tmp_path} has no history ({tmp_path / 'history'}/step-*.parquet); "
                              f"train at least one step there, or pass --trace FILE")


def test_draw_groups_covers_every_group_before_repeating():
    pool = [TraceGroup(f"p{i}", 0, (1, 1)) for i in range(5)]
    drawn = draw_groups(pool, 10, seed=1)
    assert sorted(g.group_id for g in drawn) == [f"p{i}" for i in range(5)]
    more = draw_groups(pool, 23, seed=1)
    assert sum(len(g.lengths) for g in more) == 24 and len({g.group_id for g in more[:5]}) == 5
    assert draw_groups(pool, 23, seed=1) == more


def test_step_groups_predicts_from_earlier_epochs_and_checks_workers(tmp_path):
    rows = ["group,length,epoch", "a,10,0", "a,30,0", "a,100,1", "b,7,1", "c,1,1", "d,2,1"]
    path = write(tmp_path, "t.csv", "\n".join(rows) + "\n")
    trace = read_trace(path)
    groups, predictor = step_groups(trace, BenchSetup(policies=(), workers=2, requests_per_worker=2))
    by_id = {g.prompt_id: g for g in groups}
    assert by_id["a"].predicted == 20.0 and by_id["a"].known and by_id["a"].lengths == (100,)
    assert by_id["b"].predicted == 20.0 and not by_id["b"].known  # fallback: the median
    params = PlacementSettings().step_params(predictor, 2, capacity=256)
    assert params.length_floor == 20.0  # (1 - 1/2) quantile of the recorded 10 and 30
    with pytest.raises(UsageError) as exc:
        step_groups(trace, BenchSetup(policies=(), workers=5))
    assert str(exc.value) == (f"--workers 5 is larger than the 4 requests of {path} (epoch 1); "
                              f"give at most 4 workers")
    with pytest.raises(UsageError, match=r"^--epoch 7: .* has epochs \[0, 1\]$"):
        step_groups(trace, BenchSetup(policies=(), workers=1, epoch=7))
