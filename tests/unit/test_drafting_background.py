"""Drafter work off the critical path: the background worker, and drafts that are the
same whether the work runs in its thread, inline, or is cut short."""

from __future__ import annotations

import threading

import pytest

from pipeline.bench import drafter as bench
from pipeline.bench import drafter_workload as wl
from pipeline.bench.drafter_sim import InputBatch
from pipeline.drafting.background import OPTIONAL, Background


def test_jobs_run_in_order_off_the_calling_thread_and_wait_returns_when_done():
    bg, seen = Background(), []

    def job(n):
        def steps():
            seen.append((n, threading.current_thread() is threading.main_thread()))
            yield
            seen.append((n, "end"))
        return steps

    for n in range(3):
        bg.submit(job(n))
    bg.wait()
    assert seen == [(0, False), (0, "end"), (1, False), (1, "end"), (2, False), (2, "end")]
    assert bg.idle() and bg.busy_s > 0
    bg.close()
    bg.submit(job(9))  # closed: inline
    assert seen[-2:] == [(9, True), (9, "end")]


def test_a_job_error_is_raised_by_the_next_wait():
    bg = Background()

    def broken():
        yield
        raise RuntimeError("tree call failed")

    bg.submit(broken)
    with pytest.raises(RuntimeError, match="tree call failed"):
        bg.wait()
    bg.wait()  # raised once
    bg.close()


def test_a_wait_cuts_the_optional_part_short_but_inline_runs_it_all():
    release, done = threading.Event(), []

    def job():
        done.append("needed")
        yield OPTIONAL
        release.wait(5)
        for i in range(1000):
            done.append(i)
            yield

    bg = Background()
    bg.submit(job)
    release.set()
    bg.wait()
    assert done[0] == "needed" and len(done) < 1001
    bg.close()
    done.clear()
    Background(enabled=False).submit(job)
    assert len(done) == 1001


def _drafts(background: bool, gpu_s: float) -> tuple[list, int, float]:
    shape = wl.Shape(live=32, group=8, mean_len=256, vocab=5000, rhyme=0.7, seed=3)
    start, passes, k = 64, 40, 8
    upto = start + (passes + 2) * (k + 1)
    work = wl.make(shape, upto=upto, min_len=start + 1)
    side = bench.build_ours(work, InputBatch(shape.live, shape.prompt_len + upto + k + 2), k,
                            shape.prompt_len + shape.max_len + k + 1, start, background)
    seen = []
    run_after = side.lane._after

    def record(drafts, timed):
        seen.append([list(d) for d in drafts])
        run_after(drafts, timed)

    side.lane._after = record
    side.lane.run(passes, gpu_s)
    hits = side.drafting.drafter.presumed_hits
    side.close()
    return seen, hits, side.lane.log.tau


def test_background_work_and_presumed_drafts_never_change_a_draft():
    """The tree budget's passes, inline (every presumed draft worked out) and in the
    thread (as many as the sleeps allow): the same drafts, pass by pass."""
    inline, hits, tau = _drafts(background=False, gpu_s=0.0)
    threaded, _, _ = _drafts(background=True, gpu_s=0.002)
    assert threaded == inline
    assert hits > 0 and tau > 1.5  # the presumed drafts were used, and drafts were accepted
