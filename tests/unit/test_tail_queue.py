"""Tail batching's launch queue: what a step launches, what it defers, and the replay a
resume rebuilds it with."""

from __future__ import annotations

from pipeline.loop.batches import PromptSource
from pipeline.loop.tail_queue import TailQueue


def source(n=10, batch=4, shuffle=False):
    rows = [{"id": f"p{i}", "prompt": f"q{i}", "answer": "a"} for i in range(n)]
    return PromptSource(rows, batch, seed=3, shuffle=shuffle)


def ids(launched):
    return [x.prompt.id for x in launched]


def test_a_step_launches_overprovisioned_fresh_prompts_in_stream_order():
    q = TailQueue(source(), overprovision=0.5, max_waits=2)
    first = q.launch()
    assert ids(first) == ["p0", "p1", "p2", "p3", "p4", "p5"] and q.keep == 4
    assert {x.epoch for x in first} == {0} and {x.waits for x in first} == {0}


def test_launch_size_rounds_up_per_worker():
    assert TailQueue(source(n=16, batch=8), 0.25, 2, workers=2).launch_size == 10  # 2 x ceil(5)
    assert TailQueue(source(n=16, batch=8), 0.1, 2, workers=4).launch_size == 12  # 4 x ceil(2.2)


def test_deferred_prompts_come_back_first_and_are_pinned_after_max_waits():
    q = TailQueue(source(), overprovision=0.5, max_waits=1)
    q.launch()
    assert q.settle([("p0", 0), ("p2", 0), ("p3", 0), ("p5", 0)]) == 2
    second = q.launch()
    assert ids(second) == ["p1", "p4", "p6", "p7", "p8", "p9"]
    assert q.pinned(second) == [True, True, False, False, False, False]
    assert [x.waits for x in second[:2]] == [1, 1]


def test_the_stream_crosses_epochs_and_a_prompt_can_come_twice_as_two_groups():
    q = TailQueue(source(n=6, batch=4), overprovision=0.5, max_waits=3)
    q.launch()  # p0..p5, epoch 0
    q.settle([("p0", 0), ("p1", 0), ("p2", 0), ("p3", 0)])  # p4, p5 deferred
    second = q.launch()
    assert [(x.prompt.id, x.epoch) for x in second] == [
        ("p4", 0), ("p5", 0), ("p0", 1), ("p1", 1), ("p2", 1), ("p3", 1)]
    q.settle([("p4", 0), ("p0", 1), ("p1", 1), ("p2", 1)])
    third = q.launch()
    assert [(x.prompt.id, x.epoch) for x in third][:3] == [("p5", 0), ("p3", 1), ("p4", 1)]
    assert third[0].prompt is not q.source.prompts[5]  # its own group object


def test_epochs_follow_the_prompt_sources_shuffle():
    s = source(n=8, batch=4, shuffle=True)
    q = TailQueue(s, overprovision=0.0, max_waits=2)
    got = []
    for _ in range(4):
        launched = q.launch()
        got.append(ids(launched))
        q.settle(x.key for x in launched)
    assert got == [[p.id for p in s.batch(step)] for step in range(4)]


def test_replay_rebuilds_the_live_queue():
    live = TailQueue(source(), overprovision=1.0, max_waits=2)
    trained = []
    for step in range(5):
        launched = live.launch()
        keep = [x.key for i, x in enumerate(launched) if (i + step) % 2 == 0][:4]
        live.settle(keep)
        trained.append(set(keep))
    resumed = TailQueue(source(), overprovision=1.0, max_waits=2)
    resumed.replay(trained)
    assert list(resumed.deferred) == list(live.deferred) and resumed.position == live.position
    assert ids(resumed.launch()) == ids(live.launch())
