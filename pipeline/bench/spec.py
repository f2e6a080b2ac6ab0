"""`rhymectl bench spec`: every speculative method on the same work, side by side.

For each method one vLLM engine is built and lives through the measured epochs, as a
training run's engine would: before epoch e it loads the policy checkpointed when e began,
and its drafting state learns the epochs before e — rhymectl's drafter through the same
per-prompt window training uses, vLLM's `suffix` method by having its global cache fed
the same responses (the strongest form of that peer). Then epoch e's training batches are
regenerated with the training run's per-step seeds.

Per method (all counts from `pipeline.rollout.meter`, the same for every method):
tau, accept_rate, passes, scheduled_tokens, rollout_s (wall time of the generate calls),
tok_per_s, speedup (rollout_s of none / own), floor_s (generated tokens × the measured
cost per scheduled token, the slope of a least-squares fit of pass time on scheduled
tokens over the method's own passes: no per-pass overhead, no rejected drafts — the
physical limit of that work on this machine), drafter_s / drafter_frac (time inside the
drafter) and, at temperature 0, whether its responses are token-identical to none's.
rhymectl's drafters also report drafter_{live_in,queries,group_ends}_s: where the drafter's
time went (`pipeline.drafting.stats.DrafterTimes`), summed over the measured generates.
With `spec.draft_warmup` a draft model's engine first gets a training run's warm-up
(`pipeline.bench.spec_warmup`), reported as draft_warmup: its responses, loss, and the
passes of its own rollout (0 where it learns from the evaluation's), apart from the
measured steps'.

The critical path, per step (`pipeline.critical_path`; each key is the median over the
measured steps, KEY_steps the per-step values): passes_per_step, critical_passes (passes
until the step's last request finished), tail_passes (passes with fewer than 25 % of the
step's requests running), critical_tau (tau of the request that finished last) and
tail_tau (tau over the tail passes). On a GPU, where a decode pass costs about the same
whatever it verifies, these pass counts are what carries over, not this CPU's seconds.

The GPU estimate (`gpu_estimate_*`): the same passes, each priced by a roofline model of
a named GPU and model size (`pipeline.costs.H100_7B`) from its scheduled tokens, plus what
vLLM adds around a pass there (`pipeline.gpu_cost`): the host's work after every pass of
an engine that speculates (vLLM keeps async scheduling only for none) and the CUDA graph
the pass replays in an engine built for the method's draft tokens (full only where every
request verifies all of them): an estimate from published figures, not a measurement.
gpu_estimate_s sums every pass, gpu_estimate_tail_s the tail passes,
gpu_estimate_speedup is none's over the method's, gpu_estimate_with_drafter_s adds the
drafter's time as measured on this machine; gpu_estimate_roofline_s, _host_s and
_graphs_s split gpu_estimate_s, and gpu_estimate_{full,piecewise,eager}_passes count the
passes by graph. A method with a draft model adds its forwards on the same GPU:
gpu_estimate_model_s prices each forward step as `pipeline.draft_shape.step_fraction` of
the roofline's memory-bound pass (a draft of this one's size beside a policy of the 7B's:
its own parameters and LM-head rows over the policy's, read once a step),
gpu_estimate_with_model_s adds it to gpu_estimate_s, gpu_estimate_model_speedup is none's
over that, and model_passes / model_steps count the passes that ran the model and its
forward steps.
"""

from __future__ import annotations

import gc
import json
import os
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

from pipeline import children
from pipeline import distributed as dist
from pipeline.bench.spec_plan import Plan
from pipeline.bench.spec_warmup import warm_draft
from pipeline.costs import H100_7B, Roofline
from pipeline.gpu_cost import GpuPassModel, VllmEngine
from pipeline.critical_path import step_record
from pipeline.drafting.stats import DrafterTimes
from pipeline.errors import RuntimeFailure, UsageError
from pipeline.history.store import HistoryStore, prompt_hash
from pipeline.loop.step import sampling
from pipeline.rollout.engine import RolloutEngine
from pipeline.rollout.speculation import engine_draft_tokens
from pipeline.tasks.chat import PromptEncoder
from pipeline.tasks.prompts import distinct, eval_prompts, train_rows

# per-step counts: KEY (median over steps) and KEY_steps in the summary
STEP_KEYS = ("passes_per_step", "critical_passes", "tail_passes", "critical_tau", "tail_tau")
GPU_MODEL: Roofline = H100_7B
GPU_PASSES = GpuPassModel(GPU_MODEL)
FIGURE_METHODS = ("none", "suffix", "history+group")  # the running-requests figure's


@dataclass
class StepWork:
    step: int
    prompt_ids: list[list[int]]


@dataclass
class EpochWork:
    epoch: int
    policy_dir: Path
    steps: list[StepWork]
    earlier: list  # history records of the epochs before this one not yet seen (oldest first)


@dataclass
class MethodResult:
    name: str
    rollout_s: float = 0.0
    requests: int = 0
    generated: int = 0
    passes: int = 0
    scheduled_tokens: int = 0
    seq_passes: int = 0
    prefill_seq_passes: int = 0
    draft_tokens: int = 0
    drafter_s: float = 0.0
    samples: list = field(default_factory=list)
    outputs: list = field(default_factory=list)  # token ids per request, in order
    calibration: dict | None = None  # the critical budget's `Calibrator.state()`
    sources: dict | None = None  # rhymectl's drafter: drafts served per tree
    # rhymectl's drafter: seconds by part (`DrafterTimes`) inside the measured generates
    drafter_parts: dict | None = None
    # per measured step: its critical path (`step_record`)
    steps: list = field(default_factory=list)
    # the engine as a GPU would build it for this method (`pipeline.gpu_cost.VllmEngine`)
    engine_draft_tokens: int = 0
    max_num_seqs: int = 256
    # the draft model's warm-up before the first epoch (`spec.draft_warmup`, `warm_draft`):
    # the passes it adds (paid once, outside the measured steps), its responses and loss
    draft_warmup: dict | None = None
    # the draft model's forwards in the measured steps: passes that ran it, its forward
    # steps, and their cost in memory-bound target passes (`ModelStats.step_reads`)
    model: dict | None = None

    def gpu_engine(self) -> VllmEngine:
        return VllmEngine.built_for(self.engine_draft_tokens, self.max_num_seqs)

    def add(self, counts, seconds: float, groups) -> None:
        self.steps.append(step_record(counts, groups))
        self.rollout_s += seconds
        for group in groups:
            for c in group:
                self.requests += 1
                self.generated += len(c.token_ids)
                self.outputs.append(list(c.token_ids))
        self.passes += counts.passes
        self.scheduled_tokens += counts.scheduled_tokens
        self.seq_passes += counts.seq_passes
        self.prefill_seq_passes += counts.prefill_seq_passes
        self.draft_tokens += counts.draft_tokens
        self.drafter_s += counts.draft_seconds
        self.samples.extend(counts.samples)

    def add_drafter_parts(self, times: DrafterTimes) -> None:
        """The drafter's `DrafterTimes` of one measured generate."""
        so_far = DrafterTimes(**self.drafter_parts) if self.drafter_parts else DrafterTimes()
        self.drafter_parts = so_far.plus(times).as_dict(6)


def build_work(plan: Plan, encoder: PromptEncoder) -> list[EpochWork]:
    """Epoch 1 .. E-1 of the plan's run: prompts per step and the history before each."""

    store = HistoryStore(plan.run_dir, readonly=True)
    text = {p.id: p.text for p in distinct(train_rows(plan.cfg.data))}
    records = store.read_all()
    work = []
    for e in range(1, plan.epochs):
        steps = []
        for s in range(e * plan.steps_per_epoch, (e + 1) * plan.steps_per_epoch):
            order = list(dict.fromkeys(r.prompt_id for r in records if r.step == s))
            steps.append(StepWork(s, encoder.encode_many([text[pid] for pid in order])))
        earlier = [r for r in records if r.epoch == e - 1] if e > 1 else \
            [r for r in records if r.epoch < e]
        work.append(EpochWork(e, plan.checkpoint(e), steps, earlier))
    return work


# What the worker writes on its stdout after each regenerated step (its logs go to stderr).
PROGRESS_LINE = "rhymectl-bench-step\n"


def run_isolated(config_path: Path, overrides: list[str], plan: Plan, method: str,
                 advance: Callable[[], None] = lambda: None) -> MethodResult:
    """`run_method` in a fresh Python process, so no method inherits another's process
    state (and vLLM 0.32 cannot build an engine after its n-gram proposer loaded numba:
    its kernel dispatcher trips over llvmlite's library object in `sys.modules`).
    `advance()` runs here after each step the worker regenerated."""
    # this process's own file: two benches on one run directory never read each other's
    result_path = (plan.run_dir / "report"
                   / f".bench-spec-{method.replace('+', '_')}-{os.getpid()}.json")
    result_path.parent.mkdir(parents=True, exist_ok=True)
    result_path.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "pipeline.bench.spec_worker", str(config_path), str(plan.run_dir),
           str(plan.epochs), method, str(result_path), *overrides]
    # our stdout is kept for the --json object; the worker's carries its progress

    def on_line(line: str) -> None:
        if line == PROGRESS_LINE:
            advance()
        else:
            sys.stderr.write(line)

    code = children.run(cmd, env=dict(os.environ), on_line=on_line)
    if code or not result_path.is_file():
        raise RuntimeFailure(f"bench spec: method {method} failed (exit {code}): {' '.join(cmd)}")
    data = json.loads(result_path.read_text())
    result_path.unlink()
    return MethodResult(**data)


def warmup_prompts(plan: Plan, encoder: PromptEncoder) -> list[list[int]]:
    """One step's worth of held-out prompts (never trained on, never measured): each engine
    generates them before measuring (with and without logprobs, as training's steps ask),
    so no method pays the CPU kernels' first-shape costs or the first logprob request's
    compilation inside its measurement. Empty for a user data set without data.eval_path."""

    held_out = eval_prompts(plan.cfg.data, set())[: plan.cfg.data.train_batch_size]
    return encoder.encode_many([p.text for p in held_out])


def run_method(plan: Plan, method: str, work: list[EpochWork], advance,
               warmup: list[list[int]] = (), draft_warmup: tuple[list, bool] = ([], False)
               ) -> MethodResult:
    """Regenerate every epoch's work with one method; `advance()` after each step. warmup:
    prompts every engine generates first, unmeasured (compilation); draft_warmup: the draft
    model's warm-up (`pipeline.bench.spec_warmup`; a method with a draft model only)."""

    cfg = plan.cfg
    dist.init()  # one 1-rank group for every engine (vLLM would otherwise make its own)
    engine = RolloutEngine.from_config(cfg, spec=replace(cfg.spec, method=method))
    result = MethodResult(method, engine_draft_tokens=engine_draft_tokens(
        replace(cfg.spec, method=method)), max_num_seqs=cfg.rollout.max_num_seqs)
    drafting = engine.drafting
    try:
        # the first request with logprobs compiles vLLM's logprob gather (~1.7 s here):
        # training pays it once, at its first sampler-check step
        if warmup:
            for logprobs in (True, False) if cfg.rollout.logprob_check_every else (False,):
                engine.generate(list(warmup),
                                replace(sampling(cfg, -1), seed=None, logprobs=logprobs))
        if draft_warmup[0] and drafting is not None and drafting.model is not None:
            result.draft_warmup = warm_draft(plan, engine, method, *draft_warmup)
        seen = drafting.sources() if drafting is not None else {}  # before the measured steps
        if drafting is not None and drafting.model is not None:
            drafting.model.reset_stats()
        for ew in work:
            engine.update_weights(_policy_tensors(ew.policy_dir), ew.epoch)
            _learn_history(engine, method, ew.earlier, prompt_ids_of(work),
                           _teacher_of(plan, method))
            for sw in ew.steps:
                spec = sampling(cfg, sw.step)
                before = drafting.times() if drafting is not None else None
                t0 = time.perf_counter()
                out = engine.generate(sw.prompt_ids, spec)
                result.add(out.stats.passes, time.perf_counter() - t0, out.groups)
                if drafting is not None:
                    result.add_drafter_parts(drafting.times().minus(before))
                advance()
        if drafting is not None:
            result.calibration = drafting.calibration()
            result.sources = {k: v - seen.get(k, 0) for k, v in drafting.sources().items()}
            if drafting.model is not None:
                m = drafting.model.reset_stats()
                result.model = {"passes": m.passes, "steps": m.steps,
                                "step_reads": round(m.step_reads, 6)}
    finally:
        del engine, drafting
        gc.collect()
    return result


def prompt_ids_of(work: list[EpochWork]) -> dict[str, list[int]]:
    """prompt hash -> token ids, for every prompt of the measured epochs."""

    return {prompt_hash(ids): ids for ew in work for sw in ew.steps for ids in sw.prompt_ids}


def _teacher_of(plan: Plan, method: str) -> Callable[[list, int], list] | None:
    """Where the draft model of `method` learns the policy's distribution
    (`spec.draft_distill`, temperature > 0): (rollouts, step) -> their `Teacher`s.
    Training's teacher is the policy that sampled them; the bench's run keeps a policy only
    where an epoch begins (`teacher_epoch`), so the one nearest to it teaches. None: the
    draft learns the sampled tokens."""
    from pipeline.train.teacher import policy_teachers, teacher_k

    cfg = plan.cfg
    if not teacher_k(cfg, method):
        return None

    def teach(rollouts: list, step: int) -> list:
        epoch = teacher_epoch(step, plan.steps_per_epoch)
        return policy_teachers(plan.checkpoint(epoch) if epoch else Path(cfg.model.path),
                               rollouts, cfg.spec.draft_distill)
    return teach


def teacher_epoch(step: int, steps_per_epoch: int) -> int:
    """The epoch whose starting policy is nearest to the one that sampled `step` (policy
    version `step`; ties: the older): the policy of `step`'s own epoch for its first half,
    the next epoch's for the rest."""
    epoch, offset = divmod(step, steps_per_epoch)
    return epoch + (2 * offset > steps_per_epoch)


def _learn_history(engine, method: str, records: list, prompts: dict[str, list[int]],
                   teacher: Callable[[list, int], list] | None = None) -> None:
    if not records:
        return
    if engine.drafting is not None:
        for epoch in sorted({r.epoch for r in records}):  # epoch by epoch, as training does
            engine.drafting.remember([r for r in records if r.epoch == epoch])
        if engine.drafting.model is not None:  # the draft model learns step by step, too
            for step in sorted({r.step for r in records}):
                rollouts = [(prompts[r.prompt_hash], r.response_ids) for r in records
                            if r.step == step and r.prompt_hash in prompts]
                if teacher is not None:
                    rollouts = [(p, r, t) for (p, r), t in zip(rollouts, teacher(rollouts, step))]
                engine.drafting.train_model(rollouts)
    elif method == "suffix":
        engine.warm_suffix_cache((prompts.get(r.prompt_hash, []), r.response_ids)
                                 for r in records)


def _policy_tensors(policy_dir: Path):
    from safetensors.torch import load_file

    files = sorted(policy_dir.glob("*.safetensors"))
    if not files:
        raise UsageError(f"{policy_dir} holds no safetensors weights; rerun the bench with a "
                         f"new --run-dir")
    for f in files:
        yield from load_file(str(f)).items()


__all__ = ["EpochWork", "FIGURE_METHODS", "GPU_MODEL", "GPU_PASSES", "MethodResult", "STEP_KEYS",
           "StepWork", "build_work", "run_method"]
