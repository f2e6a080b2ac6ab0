"""The parquet rollout history store: round trips, per-prompt reads, crash safety."""

from __future__ import annotations

import io

import numpy as np
import pyarrow.parquet as pq
import pytest

from pipeline.errors import UsageError
from pipeline.history import store as store_mod
from pipeline.history.store import HistoryStore, RolloutRecord, prompt_hash


def rec(prompt_id="p0", epoch=0, step=0, sample_index=0, ids=(5, 6, 7), reward=1.0,
        finish_reason="stop", gen_seconds=0.25, policy_version=None):
    return RolloutRecord(
        prompt_id=prompt_id, prompt_hash=prompt_hash([ord(c) for c in prompt_id]),
        epoch=epoch, step=step, policy_version=step if policy_version is None else policy_version,
        sample_index=sample_index, response_ids=list(ids), length=len(ids),
        finish_reason=finish_reason, reward=reward, gen_seconds=gen_seconds)


def group(prompt_id, epoch, step, lengths):
    return [rec(prompt_id, epoch, step, i, ids=range(100 + i, 100 + i + n), reward=i * 0.5)
            for i, n in enumerate(lengths)]


@pytest.fixture
def store(tmp_path):
    return HistoryStore(tmp_path / "run")


def test_round_trip_is_exact(store, tmp_path):
    step0 = [rec("a", sample_index=0, ids=[1, 2, 3], reward=0.5),
             rec("a", sample_index=1, ids=[], reward=0.0, finish_reason="length"),
             rec("b", sample_index=0, ids=[2**31 - 1, 0, 7], reward=-1.25, gen_seconds=3.5)]
    step1 = [rec("a", epoch=1, step=1, sample_index=3, ids=[9] * 50, policy_version=0)]
    assert store.append(0, step0) == tmp_path / "run" / "history" / "step-000000.parquet"
    store.append(1, step1)
    assert store.read_step(0) == step0
    assert store.read_step(1) == step1
    assert store.read_all() == step0 + step1
    assert list(store.iter_records()) == step0 + step1
    assert store.steps() == [0, 1] and store.last_step() == 1 and len(store.read_all()) == 4
    # a fresh handle sees the same committed history
    assert HistoryStore(tmp_path / "run", readonly=True).read_all() == step0 + step1


def test_schema_types_and_float32_storage(store):
    store.append(0, [rec(reward=0.1, gen_seconds=0.3)])
    table = pq.read_table(store.path(0))
    assert table.schema.equals(store_mod.SCHEMA)
    [back] = store.read_step(0)
    assert back.reward == float(np.float32(0.1)) and back.gen_seconds == float(np.float32(0.3))


def test_empty_store(tmp_path):
    store = HistoryStore(tmp_path / "nothing", readonly=True)
    assert store.steps() == [] and store.last_step() is None and len(store.read_all()) == 0
    assert store.read_all() == [] and store.lengths() == {} and store.responses("p", 2) == []
    with pytest.raises(KeyError):
        store.read_step(0)


def test_responses_over_the_last_epochs_a_prompt_was_seen_in(store):
    # p: epochs 0, 1 (over two steps), 2, 4; q: epochs 0 and 4 only
    store.append(0, group("p", 0, 0, [3, 4]) + group("q", 0, 0, [9]))
    store.append(1, group("p", 1, 1, [5]))
    store.append(2, group("p", 1, 2, [6]))
    store.append(3, group("p", 2, 3, [7, 8]))
    store.append(4, group("p", 4, 4, [2]) + group("q", 4, 4, [1]))

    def epochs(recs):
        return [(r.epoch, r.step, r.sample_index) for r in recs]

    assert epochs(store.responses("p", 2)) == [(2, 3, 0), (2, 3, 1), (4, 4, 0)]
    assert epochs(store.responses("p", 2, before_epoch=4)) == [(1, 1, 0), (1, 2, 0),
                                                               (2, 3, 0), (2, 3, 1)]
    assert epochs(store.responses("p", 1, before_epoch=1)) == [(0, 0, 0), (0, 0, 1)]
    assert epochs(store.responses("q", 2)) == [(0, 0, 0), (4, 4, 0)]  # epochs seen, not elapsed
    assert store.responses("q", 5, before_epoch=0) == []
    assert store.responses("unknown", 3) == []
    got = store.responses("p", 1)
    assert got == [rec for rec in store.read_step(4) if rec.prompt_id == "p"]
    many = store.responses_many(["p", "q", "zzz"], 1)
    assert set(many) == {"p", "q"} and many["q"][0].length == 1


def test_lengths_per_prompt_per_epoch(store):
    store.append(0, group("p", 0, 0, [3, 4]) + group("q", 0, 0, [9]))
    store.append(1, group("p", 0, 1, [5]))
    store.append(2, group("p", 1, 2, [7, 8]))
    assert store.lengths() == {"p": {0: [3, 4, 5], 1: [7, 8]}, "q": {0: [9]}}


def _half_written_parquet(table, where, **_):
    buf = io.BytesIO()
    _REAL_WRITE(table, buf)
    data = buf.getvalue()
    with open(where, "wb") as fh:
        fh.write(data[: len(data) // 2])
    raise OSError("disk died mid-append")


_REAL_WRITE = pq.write_table


def test_crash_mid_append_leaves_earlier_steps_only(store, monkeypatch):
    before = group("p", 0, 0, [3, 4])
    store.append(0, before)
    monkeypatch.setattr(store_mod.pq, "write_table", _half_written_parquet)
    with pytest.raises(OSError, match="disk died"):
        store.append(1, group("p", 1, 1, [5]))
    monkeypatch.undo()
    assert sorted(p.name for p in store.dir.iterdir()) == ["step-000000.parquet"]
    assert store.steps() == [0] and store.read_all() == before and len(store.read_all()) == 2
    store.append(1, group("p", 1, 1, [5]))
    assert store.steps() == [0, 1]


def test_stray_tmp_from_a_killed_process_is_ignored_then_cleaned(store, tmp_path):
    before = group("p", 0, 0, [3])
    store.append(0, before)
    stray = store.dir / ".step-000001.parquet.k1ll3d.tmp"
    stray.write_bytes(b"PAR1 half a row group")
    reader = HistoryStore(tmp_path / "run", readonly=True)
    assert reader.steps() == [0] and reader.read_all() == before and reader.lengths() == {
        "p": {0: [3]}}
    assert stray.exists()  # a reader never touches the folder of a running trainer
    HistoryStore(tmp_path / "run")
    assert not stray.exists()


def test_truncate_after_rolls_history_back(store):
    for s in range(5):
        store.append(s, group("p", s, s, [s + 1]))
    assert store.truncate_after(2) == [3, 4]
    assert store.steps() == [0, 1, 2] and len(store.read_all()) == 3
    assert store.truncate_after(7) == []
    store.append(3, group("p", 9, 3, [4]))  # the resumed run redoes step 3
    assert [r.epoch for r in store.read_step(3)] == [9]
    assert store.truncate_after(None) == [0, 1, 2, 3] and store.steps() == []


def test_existing_or_older_step_is_refused_unless_overwrite(store):
    store.append(0, group("p", 0, 0, [3]))
    store.append(1, group("p", 0, 1, [4]))
    with pytest.raises(UsageError, match=r"already holds step 1 .*--resume") as err:
        store.append(1, group("p", 0, 1, [5]))
    assert "\n" not in str(err.value)
    with pytest.raises(UsageError, match="cannot append step 0"):
        store.append(0, group("p", 0, 0, [5]))
    assert [r.length for r in store.read_step(1)] == [4]
    store.append(1, group("p", 0, 1, [6]), overwrite=True)
    assert [r.length for r in store.read_step(1)] == [6]


def test_misuse_is_refused(store, tmp_path):
    with pytest.raises(ValueError, match="records of step 3"):
        store.append(2, group("p", 0, 3, [1]))
    with pytest.raises(ValueError, match="readonly"):
        HistoryStore(tmp_path / "run", readonly=True).append(0, [])
    with pytest.raises(ValueError, match="last_epochs"):
        store.responses("p", 0)


@pytest.mark.parametrize("damage", ["garbage", "truncated"])
def test_corrupt_step_file_is_reported_never_skipped(store, damage):
    store.append(0, group("p", 0, 0, [3]))
    store.append(1, group("p", 1, 1, [4]))
    bad = store.path(1)
    data = bad.read_bytes()
    bad.write_bytes(b"not parquet at all" if damage == "garbage" else data[: len(data) // 2])
    assert store.steps() == [0, 1]
    for read in (store.read_all, store.lengths,
                 lambda: store.responses("p", 2), lambda: store.read_step(1)):
        with pytest.raises(UsageError) as err:
            read()
        msg = str(err.value)
        assert str(bad) in msg and "delete it" in msg and "--resume" in msg and "\n" not in msg
    assert store.read_step(0)[0].length == 3


def test_prompt_hash_is_stable_and_discriminating():
    assert prompt_hash([1, 2, 3]) == prompt_hash(np.array([1, 2, 3], dtype=np.int64))
    assert prompt_hash([1, 2, 3]) != prompt_hash([3, 2, 1])
    assert len(prompt_hash([])) == 16
