"""`rhymectl bench replay RUN_DIR`: a run's recorded rollouts drafted again, pass for pass,
by rhymectl's drafter and by vLLM's suffix proposer, without an engine or a model.

vLLM verifies a `custom_class` or `suffix` draft as a one-hot proposal, so a draft token
is accepted exactly where the token the target samples there equals it; what a response
is made of never depends on the drafts. A recorded response can therefore be replayed
against any drafter: each pass emits the longest prefix of the request's draft that
matches the recorded response, plus one token of its own (`drafter_sim.Lane`), and the
drafter is the real one, called as vLLM's runner calls it. The passes counted are the
ones those drafts would have taken for these very responses: the critical path of every
step in target passes, the measure that carries over to GPUs, in seconds of CPU.

A draft model's drafts are replayed greedy (`spec.draft_probs: false`): sampled drafts
verified with their probabilities are accepted by the policy's distribution at each
position, which a recorded token alone does not decide; the engine measures them
(`bench spec`). It learns the recorded tokens: a run keeps no record of the policy's
distribution, from which training distils it (`spec.draft_distill`).

What it leaves out: the engine's scheduling (every request of a step starts in the first
pass and runs in every pass until it ends, as in a batch that fits), and `none`'s passes
are the step's longest response (one token a pass, the first from the prefill).

The steps are replayed in order through one drafter, which is given the next step's
prompts and then each step's records after it, as the training loop gives them; `suffix`'s cache is warmed the same
way and keeps the live responses it saw, as in an engine that lives across steps.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from statistics import median
from typing import Callable, Sequence

import numpy as np

from pipeline.bench.drafter_sim import InputBatch, Lane, simulated_runner
from pipeline.config.methods import METHODS
from pipeline.critical_path import PassLog, StepPath, critical_path
from pipeline.errors import UsageError

# what a replay can draft with: rhymectl's drafters and vLLM's suffix proposer (its n-gram
# proposer needs an engine's numba kernels)
REPLAYABLE = tuple(m for m in METHODS if m not in ("none", "ngram"))
Progress = Callable[[str], None]


@dataclass(frozen=True)
class ReplayStep:
    """One recorded step: its prompts' token ids, and per prompt its responses."""

    step: int
    prompts: list[list[int]]
    responses: list[list[list[int]]]
    records: list  # the step's history records, remembered after the step


def steps_of(records: Sequence, prompt_ids: dict[str, list[int]]) -> list[ReplayStep]:
    """The run's steps in order, from its history records and prompt_hash -> token ids."""
    by_step: dict[int, list] = {}
    for r in records:
        by_step.setdefault(int(r.step), []).append(r)
    missing = sorted({r.prompt_hash for r in records if r.prompt_hash not in prompt_ids})
    if missing:
        raise UsageError(f"{len(missing)} recorded prompt(s) (e.g. {missing[0]}) are not in the "
                         "run's data set as its config encodes it: replay the run with the "
                         "config, data and model it was trained with")
    steps = []
    for s in sorted(by_step):
        rows = sorted(by_step[s], key=lambda r: (r.prompt_hash, r.sample_index))
        keys = list(dict.fromkeys(r.prompt_hash for r in rows))
        steps.append(ReplayStep(s, [list(prompt_ids[k]) for k in keys],
                                [[list(r.response_ids) for r in rows if r.prompt_hash == k]
                                 for k in keys], by_step[s]))
    return steps


def first_revisit(steps: Sequence[ReplayStep]) -> int:
    """The first step of the run's second epoch (its prompts have history), else the
    first step."""
    later = [st.step for st in steps if any(int(r.epoch) >= 1 for r in st.records)]
    return min(later) if later else steps[0].step


def none_path(step: ReplayStep) -> StepPath:
    """Without drafts every pass emits one token per running request."""
    lengths = [len(r) for group in step.responses for r in group]
    longest = max(lengths)
    running = [sum(n > p for n in lengths) for p in range(longest)]
    return critical_path(PassLog(
        tokens=running, running=running, new=[len(lengths)] + [0] * (longest - 1),
        outputs_before=[p * r for p, r in enumerate(running)],
        finish=[n - 1 for n in lengths], passes=lengths, tokens_out=lengths))


@dataclass
class StepReplay:
    path: StepPath
    drafted: int  # draft tokens sent
    accepted: int  # of them, accepted
    seq_passes: int  # request-passes after the prefill
    emitted: int  # tokens those passes emitted


def replay_step(lane: Lane, prompt_tokens: int) -> StepReplay:
    """Run `lane` to the end of its step, one pass at a time, keeping its pass log (pass 0:
    the prefill, `prompt_tokens` scheduled, every request's first token)."""
    reqs = list(lane.plan)
    finish: dict[str, int] = {}
    tokens, running, outputs = [prompt_tokens], [len(reqs)], [0]

    def ended(p: int) -> None:
        live = set(lane.batch.req_ids)
        for r in reqs:
            if r not in live and r not in finish:
                finish[r] = p

    lane.fast_forward()
    ended(0)
    while lane.batch.req_ids:
        live = lane.batch.req_ids
        tokens.append(sum(1 + len(lane.draft[r]) for r in live))
        running.append(len(live))
        outputs.append(sum(lane.produced[r] for r in live))
        lane.run(1)
        ended(len(tokens) - 1)
    ends = [finish[r] for r in reqs]
    path = critical_path(PassLog(tokens, running, [len(reqs)] + [0] * (len(tokens) - 1),
                                 outputs, ends, [f + 1 for f in ends],
                                 [lane.length[r] for r in reqs]))
    log = lane.log
    return StepReplay(path, sum(log.drafted[:len(log.accepted)]), sum(log.accepted),
                      log.seq_passes, log.emitted)


class _Work:
    """What a `Lane` reads of a step (`drafter_workload.Workload`'s fields)."""

    def __init__(self, step: ReplayStep):
        self.prompts = [np.asarray(p, dtype=np.int32) for p in step.prompts]
        self.planned = [[np.asarray(r, dtype=np.int32) for r in group] for group in step.responses]
        self.lengths = [[len(r) for r in group] for group in step.responses]


class Replayer:
    """One method's proposer, kept across the run's steps as an engine keeps it."""

    def __init__(self, method: str, spec, rows: int, width: int, max_model_len: int,
                 policy=None):
        self.method = method
        self.batch = InputBatch(rows, width)
        self.drafter_s = 0.0
        if method == "suffix":
            from pipeline.rollout.speculation import suffix_proposer

            k = spec.num_speculative_tokens
            proposer = suffix_proposer(k, max_model_len)
            self._propose = lambda sampled: proposer.propose(k, self.batch, sampled)
            self.drafting = None
        else:
            from pipeline.rollout.speculation import Drafting

            # greedy model drafts: a sampled draft verified with its probabilities is
            # accepted by p, not by the recorded token alone (spec.draft_probs)
            spec = replace(spec, method=method, draft_probs=False)
            # inline: the same drafts as with the background thread, in a fixed order
            self.drafting = Drafting(simulated_runner(spec, self.batch, max_model_len), spec,
                                     background=False, policy=policy)
            proposer, batch = self.drafting.proposer, self.batch
            self._propose = lambda sampled: proposer.propose(
                sampled, batch.num_tokens_no_spec, batch.token_ids_cpu)

    def propose(self, sampled):
        t0 = time.perf_counter()
        out = self._propose(sampled)
        self.drafter_s += time.perf_counter() - t0
        return out

    def step(self, st: ReplayStep, upcoming: ReplayStep | None) -> StepReplay:
        """One step; then, as the training loop does (`pipeline.loop.step`), the next
        step's prompts are prepared and this step's records remembered."""
        if self.drafting is not None:
            self.drafting.before(st.prompts, max(len(g) for g in st.responses))
        lane = Lane(self.method, _Work(st), self.batch, self.propose, 0, id_prefix=f"s{st.step}-")
        prompt_tokens = sum(len(p) * len(g) for p, g in zip(st.prompts, st.responses))
        out = replay_step(lane, prompt_tokens)
        if self.drafting is not None:
            self.drafting.after()
            if upcoming is not None:
                self.drafting.prepare(upcoming.prompts)
            self.drafting.remember(st.records)
            if self.drafting.model is not None:  # as the loop trains it, after the step
                self.drafting.train_model([(p, r) for p, group in zip(st.prompts, st.responses)
                                           for r in group])
        return out


def _summary(paths: list[StepPath], replays: list[StepReplay] | None, measured: list[bool],
             drafter_s: float = 0.0) -> dict:
    """Totals and medians over the measured steps."""
    chosen = [p for p, m in zip(paths, measured) if m]
    out = {"passes": sum(p.passes for p in chosen),
           "passes_per_step": median(p.passes for p in chosen),
           "critical_passes": median(p.critical_passes for p in chosen),
           "tail_passes": median(p.tail_passes for p in chosen),
           "critical_tau": _median([p.critical_tau for p in chosen]),
           "tail_tau": _median([p.tail_tau for p in chosen]),
           "steps": [p.critical_passes for p in paths]}
    if replays is not None:
        rs = [r for r, m in zip(replays, measured) if m]
        drafted, accepted = sum(r.drafted for r in rs), sum(r.accepted for r in rs)
        seq, emitted = sum(r.seq_passes for r in rs), sum(r.emitted for r in rs)
        out.update(tau=round(emitted / seq, 4) if seq else 1.0,
                   accept_rate=round(accepted / drafted, 4) if drafted else 0.0,
                   draft_tokens=drafted, drafter_s=round(drafter_s, 3),
                   drafter_ms_per_pass=round(1e3 * drafter_s / out["passes"], 3))
    return out


def _model_summary(stats: list, measured: list[bool]) -> dict:
    """The draft model's share of the measured steps' drafts (`ModelStats` per step)."""
    chosen = [s for s, m in zip(stats, measured) if m]
    drafted = sum(s.drafted for s in chosen)
    return {"model_passes": sum(s.passes for s in chosen),
            "model_rows": sum(s.ran for s in chosen),
            "model_steps": sum(s.steps for s in chosen),
            # the forwards' cost in memory-bound target passes (`ModelSource.step_fraction`)
            "model_step_reads": round(sum(s.step_reads for s in chosen), 4),
            "model_chosen": sum(s.chosen for s in chosen),
            "model_draft_tokens": drafted,
            "model_accept_rate": round(sum(s.accepted for s in chosen) / drafted, 4)
            if drafted else 0.0,
            "model_s": round(sum(s.seconds for s in chosen), 3),
            "model_train_s": round(sum(s.train_s for s in chosen), 3)}


def _median(values) -> float | None:
    known = [v for v in values if v is not None]
    return round(median(known), 4) if known else None


def replay(steps: list[ReplayStep], spec, methods: Sequence[str], first_measured: int,
           max_model_len: int, progress: Progress = lambda what: None, policy=None) -> dict:
    """Every step through every method (`none` always); steps from `first_measured` on are
    summed (the earlier ones give the drafters their history). policy: the run's
    `PolicySource`, which a method with a draft model starts it from (trained after each
    step on the step's responses, as the loop trains it)."""
    bad = [m for m in methods if m not in REPLAYABLE]
    if bad:
        raise UsageError(f"--methods: {', '.join(bad)} cannot be replayed; choose from "
                         f"{', '.join(REPLAYABLE)}")
    measured = [st.step >= first_measured for st in steps]
    if not any(measured):
        raise UsageError(f"--from-step {first_measured}: the run's last recorded step is "
                         f"{steps[-1].step}")
    rows = max(sum(len(g) for g in st.responses) for st in steps)
    width = max(len(p) + max(map(len, g)) for st in steps for p, g in
                zip(st.prompts, st.responses)) + 2 * spec.num_speculative_tokens + 2
    result = {"none": _summary([none_path(st) for st in steps], None, measured)}
    progress("none")
    for method in methods:
        rep = Replayer(method, spec, rows, width, max(width, max_model_len), policy)
        outs, model, drafter_s = [], [], 0.0
        for st, upcoming, m in zip(steps, [*steps[1:], None], measured):
            before = rep.drafter_s
            outs.append(rep.step(st, upcoming))
            drafter_s += (rep.drafter_s - before) if m else 0.0
            if rep.drafting is not None and rep.drafting.model is not None:
                model.append(rep.drafting.model.reset_stats())
            progress(method)
        result[method] = _summary([o.path for o in outs], outs, measured, drafter_s)
        if model:
            result[method].update(_model_summary(model, measured))
    if "suffix" in result:
        ref = result["suffix"]
        for name, r in result.items():
            r["vs_suffix"] = round(r["passes"] / ref["passes"], 4)
            r["critical_vs_suffix"] = round(r["critical_passes"] / ref["critical_passes"], 4)
    return {"methods": result, "step_ids": [st.step for st in steps],
            "first_measured": first_measured,
            "sequences_per_step": median(sum(len(g) for g in st.responses) for st in steps),
            "num_speculative_tokens": spec.num_speculative_tokens}




def write_replay_plot(result: dict, first_measured: int, path, title: str):
    """Passes of every replayed step per method (the step's critical path); the steps
    before `first_measured` are shaded (they give the drafters history)."""
    from matplotlib.figure import Figure

    from pipeline.atomic import write_atomic

    fig = Figure(figsize=(9, 4), layout="constrained")
    ax = fig.subplots()
    steps = result["step_ids"]
    for name, r in result["methods"].items():
        ax.plot(steps, r["steps"], marker=".", label=f"{name}: {r['passes']} passes "
                f"(median step {r['critical_passes']:g})")
    if steps and first_measured > steps[0]:
        ax.axvspan(steps[0] - 0.5, first_measured - 0.5, color="0.9", label="not summed")
    ax.set(xlabel="step", ylabel="target passes until the step's last response ended",
           title=title)
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8)
    return write_atomic(path, lambda tmp: fig.savefig(tmp, format="png", dpi=100))


__all__ = ["REPLAYABLE", "ReplayStep", "Replayer", "first_revisit", "none_path", "replay", "replay_step",
           "steps_of", "write_replay_plot"]
