"""The drafter's history window: one last-K-epochs rule, reads of a step's prompts only
(index row groups by key, newer step files, memory), memory trimmed once on disk; and
`Drafting` holding only the prompts of the rollout at hand and the next one."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pyarrow.parquet as pq
import pytest

from pipeline.config.schema import SpecConfig
from pipeline.history import index
from pipeline.history import index_file
from pipeline.history.epochs import last_epochs
from pipeline.history.store import HistoryStore, RolloutRecord, prompt_hash
from pipeline.history.window import HistoryRow, HistoryWindow, rows_of_records
from tests.unit.test_drafting_drafter import cached_prompts, history_of

PROMPTS = {name: [ord(name), 7, 7] for name in "abcdef"}


def rec(name, epoch, step, i, ids):
    return RolloutRecord(f"id-{name}", prompt_hash(PROMPTS[name]), epoch, step, step, i,
                         list(ids), len(ids), "stop", 0.5, 0.1)


def step_records(step, epoch, names, n=2):
    return [rec(name, epoch, step, i, [step * 100 + ord(name) + i] * (3 + i))
            for name in names for i in range(n)]


@pytest.fixture
def model_dir(tmp_path) -> Path:
    d = tmp_path / "model"
    d.mkdir()
    (d / "tokenizer.json").write_text("{}")
    (d / "config.json").write_text(json.dumps({"hidden_size": 8}))
    return d


def key(name):
    return prompt_hash(PROMPTS[name])


def test_last_epochs_keeps_the_newest_k_epochs_in_order():
    rows = [(0, "x"), (2, "y"), (1, "z"), (2, "w"), (3, "v")]
    assert last_epochs(rows, 2, epoch=lambda r: r[0]) == [(2, "y"), (2, "w"), (3, "v")]
    assert last_epochs(rows, 9, epoch=lambda r: r[0]) == rows
    with pytest.raises(ValueError):
        last_epochs(rows, 0, epoch=lambda r: r[0])


def test_memory_only_window_cuts_each_prompt_to_its_last_k_epochs():
    w = HistoryWindow(2)
    for step in range(4):  # one epoch a step, prompts a and b each time
        w.add(rows_of_records(step_records(step, step, "ab")))
    got = w.responses([key("a"), key("c")])
    assert list(got) == [key("a")]  # c has no history
    assert [(r.epoch, r.step) for r in got[key("a")]] == [(2, 2), (2, 2), (3, 3), (3, 3)]
    assert got[key("a")][0].ids.dtype == np.int32


def test_window_reads_the_index_newer_steps_and_memory_and_trims_memory(tmp_path, model_dir):
    run = tmp_path / "run"
    store = HistoryStore(run)
    records = {s: step_records(s, s // 2, "abc" if s % 2 == 0 else "def") for s in range(6)}
    for s in range(4):
        store.append(s, records[s])
    index.build(run, model_dir, 2)  # covers steps 0-3
    store.append(4, records[4])  # on disk, not in the index
    w = HistoryWindow(2, run)
    w.add(rows_of_records(records[5]))  # the step just gathered: no file yet
    assert w.memory_tokens() > 0
    got = w.responses([key("a"), key("d")])
    # a: epochs 0 (step 0), 1 (step 2), 2 (step 4: a newer step file) -> the last two
    assert [(r.epoch, r.step) for r in got[key("a")]] == [(1, 2)] * 2 + [(2, 4)] * 2
    # d: epochs 0 (step 1, index), 1 (step 3, index), 2 (step 5: memory only)
    assert [(r.epoch, r.step) for r in got[key("d")]] == [(1, 3)] * 2 + [(2, 5)] * 2
    want = [r.response_ids for r in records[4] if r.prompt_hash == key("a")]
    assert [r.ids.tolist() for r in got[key("a")][2:]] == want
    store.append(5, records[5])  # rank 0 wrote the step: memory lets it go
    assert [(r.epoch, r.step) for r in w.responses([key("d")])[key("d")]][-1] == (2, 5)
    assert w.memory_tokens() == 0


def test_index_fetch_reads_only_the_row_groups_of_the_keys(tmp_path, model_dir, monkeypatch):
    monkeypatch.setattr(index_file, "CHUNK_TOKENS", 8)  # a row group every few responses
    run = tmp_path / "run"
    store = HistoryStore(run)
    for s in range(3):
        store.append(s, step_records(s, s, "abcdef"))
    index.build(run, model_dir, 2)
    read = []
    original = pq.ParquetFile.read_row_groups

    def recorded(self, groups, *a, **kw):
        read.extend(groups)
        return original(self, groups, *a, **kw)

    monkeypatch.setattr(pq.ParquetFile, "read_row_groups", recorded)
    last, got = index.fetch(run, [key("b")], 2)
    total = pq.ParquetFile(run / "index" / "history.parquet").metadata.num_row_groups
    assert last == 2 and list(got) == [key("b")]
    assert [r.epoch for r in got[key("b")]] == [1, 1, 2, 2]
    assert 0 < len(read) < total  # the other keys' row groups were not read
    assert index.fetch(tmp_path / "nowhere", [key("b")], 2) == (None, {})


class _Runner:
    def __init__(self):
        from pipeline.rollout.proposer import RhymeProposer
        from pipeline.rollout.speculation import engine_draft_tokens

        k = engine_draft_tokens(SpecConfig(method="history+group"))  # as vLLM is built
        config = SimpleNamespace(speculative_config=SimpleNamespace(num_speculative_tokens=k),
                                 model_config=SimpleNamespace(max_model_len=64))
        self.drafter = RhymeProposer(config)
        self.input_batch = None


def test_drafting_holds_the_prompts_at_hand_and_the_next_only():
    from pipeline.rollout.speculation import Drafting

    d = Drafting(_Runner(), SpecConfig(method="history+group", history_epochs=2))
    d.remember(step_records(0, 0, "abcdef"))
    d.prepare([PROMPTS[n] for n in "ab"])
    assert d.ready() >= 0
    drafter = d.drafter
    assert drafter.history_prompts() == 2
    assert sorted(cached_prompts(drafter)) == sorted([key("a"), key("b")])  # trees built
    d.before([PROMPTS[n] for n in "ab"], 2)  # the prepared rollout: nothing to load
    d.after()
    d.prepare([PROMPTS[n] for n in "cd"], step_records(1, 0, "ab"))
    d.before([PROMPTS["e"]], 1)  # e.g. an evaluation between steps: c, d stay prepared
    assert sorted(cached_prompts(drafter)) == sorted([key("c"), key("d"), key("e")])
    assert drafter.history_prompts() == 3
    d.after()
    d.before([PROMPTS[n] for n in "cd"], 2)
    assert sorted(cached_prompts(drafter)) == sorted([key("c"), key("d")])
    # a remembered step reaches prompts whose history is held (here: c gets epoch 1)
    d.remember(step_records(2, 1, "c"))
    d.ready()
    assert len(history_of(drafter, key("c"))) == 4
