"""`rhymectl bench drafter --soak S`: does the drafter's memory follow the step, not the
data set? S steps of a synthetic run, each with fresh prompts, the history read from a
run directory on disk as training reads it.

A temporary run directory gets a history store holding `history_epochs` earlier epochs of
S steps each (every prompt the soak will meet, `live / group` prompts a step) and an index
built from it. Then one `Drafting` lives through S steps of the next epoch, as in training:
`use_run(run_dir)`; per step `prepare(step's prompts, last step's records)` and `ready()`
(timed: build_s, ready_wait_s), a short rollout window (`passes`, at most 20), the step's
records appended to the store as rank 0 does, and the index rebuilt every `COMMIT_EVERY`
steps as checkpoints do. After each step: resident memory (free heap handed back to the
system first, where glibc allows), the history tokens the drafter holds and the tokens the
history window keeps in memory. Flat rows are the claim; a data-set-sized history would
grow by a step's history every step.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from pipeline.bench import drafter_workload as wl
from pipeline.bench.drafter import Progress
from pipeline.bench.drafter_plan import Plan
from pipeline.bench.process_memory import release_free_heap, rss_bytes
from pipeline.bench.drafter_sim import InputBatch, Lane, simulated_runner

COMMIT_EVERY = 5  # steps between index rebuilds (checkpoints)
SOAK_PASSES = 20  # at most this many passes a step


def _records(prompts, responses, epoch: int, step: int) -> list:
    """RolloutRecords of one step: responses[p] are prompt p's (int32 arrays)."""
    from pipeline.history.store import RolloutRecord, prompt_hash

    out = []
    for prompt, group in zip(prompts, responses):
        key = prompt_hash(prompt)
        out += [RolloutRecord(f"p{key}", key, epoch, step, 0, j, ids.tolist(), len(ids), "stop",
                              0.0, 0.0) for j, ids in enumerate(group)]
    return out


def _model_dir(root: Path) -> Path:
    """A stand-in model folder: the index's fingerprint reads tokenizer and config files."""
    d = root / "model"
    d.mkdir()
    (d / "tokenizer.json").write_text("{}")
    (d / "config.json").write_text('{"architectures": ["SoakStandIn"]}')
    return d


def soak(plan: Plan, steps: int, progress: Progress) -> dict:
    from pipeline.history import index
    from pipeline.history.store import HistoryStore
    from pipeline.rollout.speculation import Drafting

    shape = plan.shapes[-1]
    epochs, passes = shape.history_epochs, min(plan.passes, SOAK_PASSES)
    start = plan.start_of(shape)
    upto = start + (passes + 2) * (plan.reach + 1)
    width = shape.prompt_len + upto + plan.reach + 2
    max_model_len = shape.prompt_len + shape.max_len + plan.reach + 1
    rows = []
    with tempfile.TemporaryDirectory(prefix="rhymectl-soak-") as tmp:
        root = Path(tmp)
        run_dir, model = root / "run", _model_dir(root)
        store = HistoryStore(run_dir)
        for e in range(epochs):  # the earlier epochs: every prompt the soak will meet
            for s in range(steps):
                progress(f"writing epoch {e} of the history, step {s + 1}/{steps}", 0)
                work = wl.make(shape, upto=upto, min_len=start + 1, first=s * shape.prompts)
                responses = [[ids for epoch, ids in h if epoch == e] for h in work.history]
                store.append(e * steps + s, _records(work.prompts, responses, e, e * steps + s))
        index.build(run_dir, model, epochs)
        spec = plan.spec_for(epochs)
        runner = simulated_runner(spec, None, max_model_len)  # each step gets its batch
        drafting = Drafting(runner, spec)
        drafting.use_run(run_dir)
        release_free_heap()
        base = rss_bytes()
        last = []
        for s in range(steps):
            step = epochs * steps + s
            work = wl.make(shape, upto=upto, min_len=start + 1, first=s * shape.prompts)
            prompts = [p.tolist() for p in work.prompts]
            t0 = time.perf_counter()
            drafting.prepare(prompts, last)
            progress(f"step {s + 1}/{steps}: building", 0)
            drafting.ready()
            build_s = time.perf_counter() - t0
            batch = InputBatch(shape.live, width)
            runner.input_batch = batch
            t1 = time.perf_counter()
            drafting.before(prompts, shape.group)
            wait_s = time.perf_counter() - t1
            lane = Lane("ours", work, batch, lambda sampled, b=batch: drafting.proposer.propose(
                sampled, b.num_tokens_no_spec, b.token_ids_cpu), start)
            lane.run(passes)
            drafting.after()
            last = _records(work.prompts, work.planned, epochs, step)
            store.append(step, last)
            if (s + 1) % COMMIT_EVERY == 0:
                index.build(run_dir, model, epochs)
            drafting.ready()
            release_free_heap()
            stats = drafting.drafter.stats()
            rows.append({"step": s, "rss_bytes": rss_bytes(), "rss_growth": rss_bytes() - base,
                         "history_tokens": stats.history_tokens,
                         "history_prompts": drafting.drafter.history_prompts(),
                         "tree_bytes": stats.tree_bytes,
                         "window_memory_tokens": drafting.history.memory_tokens(),
                         "build_s": round(build_s, 3), "ready_wait_s": round(wait_s, 4),
                         "tau": round(lane.log.tau, 4)})
            progress(f"step {s + 1}/{steps}", 1)
        drafting.drafter.close()
    half = rows[len(rows) // 2:]
    return {"title": (f"soak: {steps} steps x {shape.prompts} fresh prompts x {shape.group}, "
                      f"{shape.mean_len}-token responses, {epochs} epochs of history read from "
                      f"disk, index rebuilt every {COMMIT_EVERY} steps"),
            "workload": {"live": shape.live, "group": shape.group, "mean_len": shape.mean_len,
                         "vocab": shape.vocab, "rhyme": shape.rhyme, "history_epochs": epochs,
                         "seed": shape.seed, "passes_per_step": passes, "steps": steps,
                         "commit_every": COMMIT_EVERY},
            "steps": rows,
            "rss_growth_first_half_max": max(r["rss_growth"] for r in rows[:max(1, len(rows) // 2)]),
            "rss_growth_second_half_max": max(r["rss_growth"] for r in half),
            "history_tokens_max": max(r["history_tokens"] for r in rows)}


__all__ = ["soak"]
