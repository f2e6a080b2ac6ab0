"""`rhymectl bench drafter`: what drafting costs per target pass at production shape,
rhymectl's drafter against vLLM's suffix proposer, on the same synthetic token streams.

Both proposers are driven as vLLM's model runner drives them (`pipeline.bench.drafter_sim`),
each on its own copy of one RL step of `pipeline.bench.drafter_workload`: `live` requests,
`group` per prompt, log-normal lengths, spans repeated across siblings and epochs at the
`rhyme` rate. rhymectl's drafter is the training path: `Drafting` (`pipeline.rollout.
speculation`) is given the step's history (`remember`), builds the step's trees
(`prepare`, timed as build_s) and serves `RhymeProposer.propose` with the shipped
settings (`spec.method: history+group`, budget `tree`). vLLM's `SuffixDecodingProposer`
runs with vLLM's defaults, its global cache warmed with the same history (the responses
a persistent engine would have cached, its strongest setting; warm-up timed as build_s).

A whole step at 512 x 8k tokens is thousands of passes, so a window is simulated: the
first call hands every request its first `start` output tokens (untimed), then `passes`
timed passes follow. Between passes the "GPU" sleeps `gpu_ms` (the GIL released, as the
runner waiting on CUDA): rhymectl's drafter does the work the next drafts need but these
did not in that time, in a background thread (`pipeline.drafting.background`). The two
proposers alternate `window` passes at a time, the order rotating by repeat, and each
repeat rebuilds both from scratch; a pass's time is the median over repeats (the
simulation is deterministic, so pass i is the same work in every repeat), and the report
gives the median and p99 over passes.

Reported per proposer: per_pass_ms (time inside `propose`: what the pass waits for), tau
(tokens per sequence and pass) and accept_rate (accepted / drafted tokens) over the timed
passes, build_s and history_bytes (resident memory the history added: RSS growth while
building, free heap handed back first and after, in the first repeat, plus the int32
arrays the drafter keeps of it, which alias the workload's here). rhymectl's drafter also
gives tree_bytes, the trees' own estimate after the build (history only) and after the
window (with the live responses). For
rhymectl's drafter also its parts (wait for background work, tokens recorded, budget,
drafts) and background_ms (the CPU time of the work moved off the critical path, per
pass: the last pass's job, done by the time the pass drafts).
"""

from __future__ import annotations

import gc
import os
import platform
from dataclasses import dataclass, replace
from types import SimpleNamespace
from typing import Callable

import numpy as np

from pipeline.bench import drafter_workload as wl
from pipeline.bench.drafter_sim import InputBatch, Lane, simulated_runner
from pipeline.bench.drafter_plan import Plan
from pipeline.bench.process_memory import measured_build
from pipeline.config.schema import SpecConfig

Progress = Callable[[str, int], None]  # (what is running, passes just done)


# ------------------------------------------------------------------ the two proposers

@dataclass
class Side:
    """One proposer on one step: its lane, what building its history cost, and for
    rhymectl's drafter its per-pass parts."""

    lane: Lane
    build_s: float
    rss_growth: int
    close: Callable[[], None]
    parts: dict[str, list[float]] | None = None
    drafting: object = None
    tree_bytes: int = 0  # the trees' own estimate right after the build (history only)


def _history_records(work: wl.Workload) -> list[SimpleNamespace]:
    from pipeline.history.store import prompt_hash

    return [SimpleNamespace(prompt_hash=prompt_hash(prompt), epoch=e, step=e, response_ids=ids,
                            reward=0.0)
            for prompt, hist in zip(work.prompts, work.history) for e, ids in hist]


def build_ours(work: wl.Workload, batch: InputBatch, k: int, max_model_len: int,
               start: int, background: bool = True, spec: SpecConfig | None = None) -> Side:
    """rhymectl's drafter lane, with `spec` (default: history+group's defaults, k tokens)."""
    from pipeline.rollout.speculation import Drafting

    spec = replace(spec or SpecConfig(method="history+group", num_speculative_tokens=k),
                   history_epochs=work.shape.history_epochs)
    drafting = Drafting(simulated_runner(spec, batch, max_model_len), spec,
                        background=background)
    drafting.remember(_history_records(work))
    prompts = [p.tolist() for p in work.prompts]
    _, build_s, growth = measured_build(lambda: (drafting.prepare(prompts), drafting.ready()))
    tree_bytes = drafting.drafter.stats().tree_bytes
    drafting.before(prompts, work.shape.group)
    proposer, drafter = drafting.proposer, drafting.drafter
    parts: dict[str, list[float]] = {n: [] for n in ("wait", "update", "budget", "draft",
                                                     "background")}
    names = (("wait", "wait_seconds"), ("update", "update_seconds"),
             ("budget", "budget_seconds"), ("draft", "draft_seconds"))

    busy = [0.0]  # background CPU seconds when the last call returned

    def propose(sampled):
        s = proposer.stats
        was = [getattr(s, a) for _, a in names]
        out = proposer.propose(sampled, batch.num_tokens_no_spec, batch.token_ids_cpu)
        for (n, a), w in zip(names, was):
            parts[n].append((getattr(s, a) - w) * 1e3)
        # the last pass's background job finished before this call drafted
        now = drafter.background_cpu_s
        parts["background"].append((now - busy[0]) * 1e3)
        busy[0] = now
        return out

    lane = Lane("ours" if background else "ours-inline", work, batch, propose, start)
    return Side(lane, build_s, growth, drafter.close, parts, drafting, tree_bytes)


def build_suffix(work: wl.Workload, batch: InputBatch, k: int, max_model_len: int,
                 start: int, spec: SpecConfig | None = None) -> Side:
    """vLLM's suffix proposer with vLLM's defaults (`spec` is rhymectl's, not used)."""
    from pipeline.rollout.speculation import suffix_proposer, warm_suffix_proposer

    proposer = suffix_proposer(k, max_model_len)
    history = [(prompt, ids) for prompt, hist in zip(work.prompts, work.history) for _, ids in hist]
    _, build_s, growth = measured_build(lambda: warm_suffix_proposer(proposer, history))
    lane = Lane("suffix", work, batch, lambda sampled: proposer.propose(k, batch, sampled), start)
    return Side(lane, build_s, growth, lambda: None)


# ------------------------------------------------------------------ measuring

def _floor_lane(*args, **kw) -> Side:
    from pipeline.bench.drafter_floor import build_floor  # it imports this module

    return build_floor(*args, **kw)


def _model_lane(*args, **kw) -> Side:
    from pipeline.bench.drafter_model import build_model_lane  # it imports this module

    return build_model_lane(*args, **kw)


BUILDERS = {"ours": build_ours,
            "ours-inline": lambda *a, **kw: build_ours(*a, background=False, **kw),
            "suffix": build_suffix,
            "floor": _floor_lane,
            "model": _model_lane}


def measure_point(plan: Plan, shape: wl.Shape, progress: Progress) -> dict:
    """Every lane on `shape`, `plan.repeats` times; one point of the report."""
    start = plan.start_of(shape)
    upto = start + (plan.passes + 2) * (plan.reach + 1)
    progress(f"workload {shape.live} x {shape.mean_len}", 0)
    work = wl.make(shape, upto=upto, min_len=start + 1)
    width = shape.prompt_len + upto + plan.reach + 2
    max_model_len = shape.prompt_len + shape.max_len + plan.reach + 1
    logs: dict[str, list] = {name: [] for name in plan.lanes}
    parts: dict[str, list] = {name: [] for name in plan.lanes}
    first: dict[str, dict] = {}
    for rep in range(plan.repeats):
        sides = {}
        for name in plan.lanes:
            progress(f"{shape.live} live: building {name} [{rep + 1}/{plan.repeats}]", 0)
            gc.collect()
            extra = {"config": plan.model_config} if name == "model" else {}
            sides[name] = BUILDERS[name](work, InputBatch(shape.live, width), plan.k,
                                         max_model_len, start,
                                         spec=plan.spec_for(shape.history_epochs), **extra)
        shift = rep % len(plan.lanes)  # the order rotates: A B C, B C A, ...
        order = plan.lanes[shift:] + plan.lanes[:shift]
        for name in order:
            sides[name].lane.fast_forward()
        # as vLLM's engine does after its warm-up: what exists now is never scanned again
        gc.collect()
        gc.freeze()
        done = {name: 0 for name in order}
        while any(done[n] < plan.passes_of(n) and sides[n].lane.live for n in order):
            for name in order:
                want = min(plan.window, plan.passes_of(name) - done[name])
                ran = sides[name].lane.run(want, plan.gpu_ms / 1e3) if want > 0 else 0
                done[name] += ran
                progress(f"{shape.live} live: {name} [{rep + 1}/{plan.repeats}]", ran)
        gc.unfreeze()
        if rep == 0:
            first = {name: _first_repeat(side) for name, side in sides.items()}
        for name, side in sides.items():
            logs[name].append(side.lane.log)
            parts[name].append(side.parts)
            side.close()
        del sides
        gc.collect()
    return _point(plan, shape, work, start, logs, parts, first)


def _first_repeat(side: Side) -> dict:
    out = {"build_s": side.build_s, "rss_growth": side.rss_growth}
    if side.drafting is not None:
        drafter = side.drafting.drafter
        stats = drafter.stats()
        out.update(tree_bytes=side.tree_bytes, history_tokens=stats.history_tokens,
                   tree_bytes_after=stats.tree_bytes, sources=drafter.sources(),
                   presumed_hits=drafter.presumed_hits)
    return out


def _per_pass(series: list[list[float]]) -> np.ndarray:
    """Per pass, the median over repeats (passes every repeat ran)."""
    n = min(len(x) for x in series)
    return np.median(np.array([x[:n] for x in series]), axis=0) if n else np.zeros(0)


def _spread(ms: np.ndarray) -> dict:
    if not len(ms):
        return {"median": None, "p99": None, "mean": None}
    return {"median": round(float(np.median(ms)), 4),
            "p99": round(float(np.percentile(ms, 99)), 4),
            "mean": round(float(np.mean(ms)), 4)}


def _point(plan: Plan, shape: wl.Shape, work: wl.Workload, start: int, logs: dict,
           parts: dict, first: dict) -> dict:
    out = {"live": shape.live, "prompts": shape.prompts, "start_token": start,
           "history_tokens": work.history_tokens}
    for name in plan.lanes:
        ms = _per_pass([log.ms for log in logs[name]])
        n = len(ms)
        log = logs[name][0]
        side = {"per_pass_ms": _spread(ms),
                "per_pass_cpu_ms": _spread(_per_pass([lg.cpu_ms for lg in logs[name]])),
                "per_pass_ms_by_repeat": [round(float(np.median(lg.ms)), 4)
                                          for lg in logs[name]],
                "passes": n, "tau": round(log.tau, 4), "accept_rate": round(log.accept_rate, 4),
                "drafted_per_pass": round(float(np.mean(log.drafted)), 2) if log.drafted else 0.0,
                "build_s": round(first[name]["build_s"], 3),
                "history_bytes": int(first[name]["rss_growth"])}
        if name.startswith("ours"):
            side["history_bytes"] += 4 * first[name]["history_tokens"]
            side["tree_bytes"] = int(first[name]["tree_bytes"])
            side["tree_bytes_after_window"] = int(first[name]["tree_bytes_after"])
            side["sources"] = first[name]["sources"]
            side["presumed_hits"] = first[name]["presumed_hits"]
            # parts: every propose call, the untimed first one included; the timed are last
            side["parts_ms"] = {part: round(float(np.median(_per_pass(
                [p[part][-n:] for p in parts[name]]))), 4)
                for part in ("wait", "update", "budget", "draft")}
            side["background_ms"] = _spread(_per_pass([p["background"][-n:]
                                                       for p in parts[name]]))
        side["rows"] = [int(r) for r in log.rows[:n]]
        side["ms"] = [round(float(x), 4) for x in ms]
        out[name] = side
    ours, suffix = out["ours"]["per_pass_ms"]["median"], out["suffix"]["per_pass_ms"]["median"]
    out["ours_over_suffix"] = round(ours / suffix, 4) if ours and suffix else None
    return out


def run(plan: Plan, progress: Progress = lambda what, n: None) -> dict:
    """Every point of the plan; the report (JSON-ready, no paths)."""
    load_before = os.getloadavg()
    points = [measure_point(plan, shape, progress) for shape in plan.shapes]
    load_after = os.getloadavg()
    s = plan.shapes[-1]
    report = {
        "workload": {"live": [p.live for p in plan.shapes], "group": s.group,
                     "mean_len": s.mean_len, "vocab": s.vocab, "rhyme": s.rhyme,
                     "history_epochs": s.history_epochs, "seed": s.seed,
                     "prompt_len": s.prompt_len, "k": plan.k, "passes": plan.passes,
                     "repeats": plan.repeats, "window": plan.window, "gpu_ms": plan.gpu_ms,
                     "lanes": list(plan.lanes), "spec": list(plan.overrides),
                     "budget": plan.spec_for(s.history_epochs).budget,
                     "method": "history+group"},
        "window": (f"a window of at most {plan.passes} decode passes, from output token "
                   f"{plan.start_of(s)} of every request on (the rollout's first passes are "
                   f"not simulated)"),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "platform": platform.platform(terse=True),
                    "loadavg_before": [round(x, 2) for x in load_before],
                    "loadavg_after": [round(x, 2) for x in load_after]},
        "points": points,
    }
    if plan.model_config is not None:
        from pipeline.bench.drafter_model import describe

        report["workload"]["model"] = describe(plan.model_config, plan.spec_for(s.history_epochs))
    last = points[-1]
    for name in plan.lanes:
        report[name] = last[name]
    report["ours_over_suffix"] = last["ours_over_suffix"]
    return report


__all__ = ["measure_point", "run"]
