"""Production-shaped traces (scripts/sched_lab/synth.py): the shape's bounds, the same
trace for the same seed, and the CSV that `bench sched --trace` reads back unchanged."""

from __future__ import annotations

import sys
from pathlib import Path

from pipeline.sched.trace import read_trace

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))  # as the scripts run
from sched_lab.synth import Shape, production_trace, write_csv  # noqa: E402

SHAPE = Shape(prompts=12, n=4, epochs=3, mean_tokens=500.0, max_tokens=1024, min_tokens=8)


def test_every_prompt_has_a_group_per_epoch_within_the_bounds():
    trace = production_trace(SHAPE, seed=3)
    assert trace.epochs() == [0, 1, 2]
    assert [(g.group_id, g.epoch) for g in trace.groups] == [
        (f"q{p}", e) for e in range(3) for p in range(12)]
    assert all(len(g.lengths) == 4 and all(8 <= x <= 1024 for x in g.lengths) for g in trace.groups)


def test_a_seed_gives_one_trace():
    assert production_trace(SHAPE, seed=3) == production_trace(SHAPE, seed=3)
    assert production_trace(SHAPE, seed=3).groups != production_trace(SHAPE, seed=4).groups


def test_the_csv_reads_back_as_the_same_groups(tmp_path):
    trace = production_trace(SHAPE, seed=3)
    write_csv(trace, tmp_path / "t.csv")
    back = read_trace(tmp_path / "t.csv")
    assert sorted(back.groups, key=lambda g: (g.epoch, g.group_id)) == \
        sorted(trace.groups, key=lambda g: (g.epoch, g.group_id))
