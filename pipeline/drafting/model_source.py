"""The draft model as a draft source beside the trees (`spec.method: history+group+model`).

One `ModelSource` per rollout engine holds a `DraftTrainer` (its `DraftModel` started from
the policy, `pipeline.drafting.draft_model.from_policy`) and, during a rollout, each running
request's keys and values (`DraftCache`). The proposer asks it once per pass, after the
budget has granted the trees' drafts:

- which candidates the model drafts for: every one with room except those whose tree
  draft is expected to have within one token of as many tokens accepted as the request
  may draft (the model could add at most one), so that the model's forward is not paid
  where the trees already draft about all there is to draft;
- the model's draft for them (k tokens, at most each one's room), with its probability of
  its argmax at each step at the rollout's temperature (how sure it is that its argmax is
  the policy's): at T > 0 with `spec.draft_probs` (`sampling`) each token drawn from the
  model's distribution q with the request's seed (`sample_cached`), and q kept for vLLM's
  rejection sampler (`take_probs`), which then accepts min(1, p/q) and keeps the output
  the policy's; otherwise (and always at T = 0) the argmax, verified as a point mass
  (`propose_cached`);
- per request, the tree's draft, the model's draft or nothing. Under `spec.budget: tree`
  (every request drafts what its source supports) the model's draft is cut where its path
  probability falls below `spec.min_path_prob`, as the trees cut theirs, and the source
  with more expected accepted tokens wins. Under the priced budgets (`critical`,
  `throughput`) `pipeline.drafting.choice.choose` decides: expected accepted tokens,
  weighted toward the requests predicted to end the step, per unit of the pass cost they
  add, priced with the fixed `DRAFT_COST` so that a seeded rerun chooses the same.
  Either way each source's estimates are first scaled by accepted over expected tokens of
  its drafts so far in the rollout (`observe`, for both sources;
  `pipeline.drafting.source_evidence`), so that a confident, wrong source loses; the
  scaling restarts with every rollout.
- the k of `propose_cached` is the most any request it runs for may draft in the pass (at
  most `max_len`, the engine's cap: `spec.thin_draft_tokens` in a thin pass, where the few
  running requests set the step's critical path). Under the `tree` budget the model stops
  drafting once every row's path probability is below `spec.min_path_prob`, past which
  no row's draft is kept. Under the priced budgets each of its forward steps is priced
  too (`_pays`): one step costs `step_fraction` of the memory-bound part of a pass (its
  own parameters and LM-head rows over the policy's, both read once), and a step runs
  only while the rows' next tokens, at most as likely accepted as their paths so far and
  weighted as the choice weighs them, could pay for it; the model is not run at all in a
  pass where not even a sure first token of every row would.

Between steps `train(rollouts)` runs the trainer's fixed number of AdamW updates on the
step's responses (never inside a rollout), and clears the cache, whose keys and values
were the old weights'. The model lives outside vLLM (plain torch on the CPU, in the
engine's process): sleep and wake do not touch it, and a weight sync does not reload it.
`save` / `load` put the trainer's whole state (weights, AdamW moments, counters) in a
checkpoint, so that `--resume` drafts and trains as the uninterrupted run.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Hashable, Sequence

import torch

from pipeline.costs import DRAFT_COST
from pipeline.draft_shape import policy_parameters, step_fraction
from pipeline.drafting.choice import (MODEL, TREE, ChoiceCosts, Options, SourceDraft, choose,
                                      token_values, tree_draft, worth_a_step)
from pipeline.drafting.draft_model import from_policy, policy_state, shape_for
from pipeline.drafting.draft_propose import (DraftCache, expected_accepted, propose_cached,
                                             sample_cached)
from pipeline.drafting.draft_train import DraftTrainer, TrainReport, TrainSettings
from pipeline.drafting.source_evidence import SourceEvidence

STATE_NAME = "model-rank-{rank}.safetensors"


@dataclass
class ModelStats:
    """Counters since the last `reset_stats`: passes that ran the model, rows it drafted
    for (ran), rows that
    took its draft (chosen), its draft tokens proposed and accepted, the seconds of its
    forward passes, and of its training."""

    passes: int = 0  # passes that ran the model
    ran: int = 0
    chosen: int = 0
    drafted: int = 0
    accepted: int = 0
    seconds: float = 0.0
    train_s: float = 0.0  # in `train` since the last reset
    steps: int = 0  # the model's forwards (each pass that ran it: one per draft token)
    # those forwards' cost in memory-bound target passes (sum of `ModelSource.step_fraction`)
    step_reads: float = 0.0


class ModelSource:
    """The draft model, its per-request caches and its choice against the trees."""

    def __init__(self, trainer: DraftTrainer, max_len: int, priced: bool = True,
                 min_path_prob: float = 0.1, sample: bool = False, policy_params: int = 0):
        """policy_params: the policy's parameters, what one of the model's forward steps
        is priced against (`step_fraction`; 0: its steps are not priced)."""
        self.trainer = trainer
        self.policy_params = int(policy_params)
        self.max_len = int(max_len)
        self.priced = priced
        self.min_path_prob = float(min_path_prob)
        self.temperature = 1.0
        self.sample = sample  # draw drafts from q and hand q to the verifier (at T > 0)
        self.sampling = sample  # this rollout's: `sample` at T > 0, never greedy
        # the last `choose`'s sampled drafts: candidate -> row of `_dists` [rows, steps, V]
        self._picked: dict[int, int] = {}
        self._dists: torch.Tensor | None = None
        self.cache = DraftCache()
        self.stats = ModelStats()
        # how this rollout's drafts from each source fared, which scales later estimates
        self.evidence = SourceEvidence()

    @classmethod
    def from_policy(cls, policy_dir: str | Path, *, layers: int, settings: TrainSettings,
                    seed: int, max_len: int, priced: bool = True,
                    min_path_prob: float = 0.1, sample: bool = False,
                    device: torch.device | str = "cpu") -> "ModelSource":
        """The source of a draft started from the policy in `policy_dir`, drafting and
        training on `device`."""
        config, state = policy_state(policy_dir)
        model = from_policy(config, state, shape_for(config, layers=layers), seed=seed)
        model.to(device).eval()
        return cls(DraftTrainer(model, settings, seed), max_len, priced, min_path_prob, sample,
                   policy_parameters(config))

    # -- a rollout ----------------------------------------------------------------------
    def set_temperature(self, temperature: float) -> None:
        """The rollout's sampling temperature (its drafts' acceptance estimates use it, and
        sampled drafts draw at it). At 0 (greedy verification, which ignores draft
        probabilities) drafts are the argmax."""
        self.temperature = float(temperature) if temperature > 0 else 1.0
        self.sampling = self.sample and temperature > 0

    @property
    def step_fraction(self) -> float:
        """One forward step of the model as a share of a memory-bound target pass
        (`pipeline.draft_shape.step_fraction`, its LM head over its draft vocabulary); 0
        where the policy's size is not known."""
        if not self.policy_params:
            return 0.0
        ids = self.trainer.model.draft_ids
        return step_fraction(self.trainer.model.shape, None if ids is None else len(ids),
                             self.policy_params)

    @property
    def vocab_ids(self) -> torch.Tensor | None:
        """The token id of each column of the distributions `take_probs` returns (None:
        column i is token i, the whole vocabulary)."""
        return self.trainer.model.draft_ids

    @property
    def vocab_size(self) -> int:
        return int(self.trainer.model.shape.vocab_size)

    def take_probs(self) -> tuple[dict[int, int], torch.Tensor | None]:
        """The distributions the last `choose`'s model drafts were drawn from: (candidate
        index -> its row of Q, Q [rows, steps, columns] (`vocab_ids`) on the model's
        device); a row's first len(draft) steps are its draft's, later ones were not drawn
        for it. Empty unless `sampling`; handed out once."""
        out = (self._picked, self._dists)
        self._picked, self._dists = {}, None
        return out

    def choose(self, req_ids: Sequence[Hashable], trees: Sequence[tuple[list[int], list[float]]],
               available: Sequence[int], context: Callable[[int], Sequence[int]],
               remaining: Callable[[Sequence[Hashable]], Sequence[tuple[float, float]]],
               seed: Callable[[int], int] | None = None) -> list[tuple[str, list[int]]]:
        """(source, tokens) per candidate of one pass. trees[j]: the tokens the budget
        granted candidate j from the trees and their path probabilities; available[j]: the
        most tokens it may draft; context(j): its tokens so far (prompt and output);
        seed(j): its sampling seed, which a sampled draft's randomness derives from
        (`sampling` needs it; the distributions drawn from: `take_probs`)."""
        self._picked, self._dists = {}, None
        k = self.max_len
        # the model can add at most min(k, room) - E(tree) expected tokens: not run where
        # that is one token or less
        run = [j for j, (_, probs) in enumerate(trees)
               if available[j] > 0 and float(sum(probs)) < min(k, available[j]) - 1]
        out = [(TREE if toks else "none", list(toks)) for toks, _ in trees]
        raw = [float(sum(probs)) for _, probs in trees]  # a tree draft's expected accepted
        ids = [req_ids[j] for j in run]
        rem = remaining(ids) if run else []
        more = self._pays(rem) if run and self.priced else None
        if more is not None and not more(torch.ones(len(run))):
            run = []  # not even a sure first token of every row would pay the model's step
        if run:
            k = min(k, max(available[j] for j in run))
            start = time.perf_counter()
            stop = 0.0 if self.priced else self.min_path_prob
            contexts = [context(j) for j in run]
            if self.sampling:
                if seed is None:
                    raise ValueError("sampled drafts need each request's seed")
                toks, probs, dists = sample_cached(
                    self.trainer.model, self.cache, ids, contexts, k, self.temperature,
                    [seed(j) for j in run], stop, more)
            else:
                toks, probs = propose_cached(self.trainer.model, self.cache, ids, contexts, k,
                                             self.temperature, stop, more)
            self.stats.seconds += time.perf_counter() - start
            self.stats.passes += 1
            self.stats.ran += len(run)
            steps = len(toks[0])  # every row drafts as many tokens, one forward each
            self.stats.steps += steps
            self.stats.step_reads += steps * self.step_fraction
            options, models = [], []
            for n, j in enumerate(run):
                cap = available[j]
                model = SourceDraft(tuple(toks[n][:cap]), tuple(probs[n][:cap]))
                models.append(model)
                options.append(Options(req_ids[j], self.evidence.calibrated(
                    tree_draft(*trees[j]), TREE), self.evidence.calibrated(model, MODEL),
                    tuple(rem[n])))
            if self.priced:
                costs = ChoiceCosts(DRAFT_COST, max_len=self.max_len)  # the model's pass is paid
                picks = [(c.source, c.tokens) for c in choose(options, costs)]
            else:
                picks = [self._likelier(tree_draft(*trees[j]), model)
                         for j, model in zip(run, models)]
            for n, (model, j, (source, tokens)) in enumerate(zip(models, run, picks)):
                out[j] = (source, list(tokens))
                if source == MODEL:
                    self.stats.chosen += 1
                    self.stats.drafted += len(tokens)
                    raw[j] = expected_accepted(model.accept[:len(tokens)])
                    if self.sampling and tokens:
                        self._picked[j] = n
                elif source == TREE:
                    raw[j] = float(sum(trees[j][1][:len(tokens)]))
            if self._picked:  # the picked rows' distributions, stacked once
                at = torch.tensor(list(self._picked.values()), device=dists[0].device)
                self._dists = torch.stack([d[at] for d in dists], 1)
                self._picked = {j: r for r, j in enumerate(self._picked)}
        for req, (source, tokens), e in zip(req_ids, out, raw):
            if tokens:
                self.evidence.sent(req, source, e)
        return out

    def _pays(self, remaining: Sequence[tuple[float, float]]) -> Callable[[torch.Tensor], bool]:
        """The priced budgets' rule for the model's forward steps (`choice.worth_a_step`):
        given the rows' path probabilities so far, whether one more step pays for itself,
        its cost `step_fraction` of the fixed pass cost's memory-bound part
        (`DRAFT_COST.base_s`), each row's next token worth what `choose` will weigh it by
        and at most as likely accepted as its path so far, scaled by how the model's drafts
        fared in this rollout. A function of the model's outputs and fixed costs only, so
        that a seeded rerun drafts the same."""
        costs = ChoiceCosts(DRAFT_COST, max_len=self.max_len)
        values = token_values(remaining, [1.0] * len(remaining), costs)
        m, step_s, ratio = DRAFT_COST.per_token_s, DRAFT_COST.base_s * self.step_fraction, \
            self.evidence.ratio(MODEL)

        def more(path: torch.Tensor) -> bool:
            return worth_a_step([float(p) * ratio for p in path.tolist()], values, m, step_s)
        return more

    def _likelier(self, tree: SourceDraft | None,
                  model: SourceDraft) -> tuple[str, tuple[int, ...]]:
        """Unpriced (the `tree` budget: every request drafts what its source supports):
        the model's draft cut where its path probability falls below min_path_prob, as
        the trees cut theirs, if it is expected to have more tokens accepted than the
        tree's draft, each source's estimate scaled by how its drafts fared in this
        rollout (`SourceEvidence.ratio`); else the tree's."""
        keep, run, model_e = 0, 1.0, 0.0
        for a in model.accept:
            run *= float(a)
            if run < self.min_path_prob:
                break
            keep, model_e = keep + 1, model_e + run
        tree_e = expected_accepted(tree.accept) * self.evidence.ratio(TREE) if tree else 0.0
        if keep and model_e * self.evidence.ratio(MODEL) > tree_e:
            return MODEL, model.tokens[:keep]
        return (TREE, tree.tokens) if tree else ("none", ())

    def observe(self, req_id: Hashable, proposed: int, accepted: int) -> None:
        """The request's last draft (the trees' or the model's) of `proposed` tokens had
        `accepted` accepted."""
        if self.evidence.observe(req_id, accepted) == MODEL:
            self.stats.accepted += accepted

    def forget(self, req_id: Hashable) -> None:
        """The request stopped."""
        self.cache.forget(req_id)
        self.evidence.forget(req_id)

    def end_step(self) -> None:
        """The rollout is over: caches and calibration go (each rollout learns its own)."""
        self.cache.clear()
        self.evidence.reset()

    def reset_stats(self) -> ModelStats:
        """The counters so far; new ones start."""
        stats, self.stats = self.stats, ModelStats()
        return stats

    # -- between rollouts ---------------------------------------------------------------
    def train(self, rollouts: Sequence[tuple]) -> TrainReport:
        """The trainer's updates on one step's (prompt ids, response ids[, teacher]); the
        cache goes (it holds the old weights' keys and values)."""
        self.cache.clear()
        report = self.trainer.train(rollouts)
        self.stats.train_s += report.seconds
        return report

    def warm_up(self, rollouts: Sequence[tuple], updates: int) -> TrainReport:
        """Before the first step: the trainer's warm-up (`DraftTrainer.warm_up`) on the
        starting policy's responses to prompts the run does not train on; the cache goes."""
        self.cache.clear()
        report = self.trainer.warm_up(rollouts, updates)
        self.stats.train_s += report.seconds
        return report

    def save(self, folder: Path, rank: int) -> Path:
        """The trainer's state into FOLDER (atomically)."""
        from pipeline.atomic import write_atomic
        from pipeline.drafting.draft_state import save_state

        path = Path(folder) / STATE_NAME.format(rank=rank)
        return write_atomic(path, lambda tmp: save_state(self.trainer, tmp))

    def load(self, folder: Path, rank: int) -> bool:
        """The state `save` left in FOLDER (False when it holds none); ValueError when it
        is not a draft model's state or not this model's shape."""
        from pipeline.drafting.draft_state import load_state

        path = Path(folder) / STATE_NAME.format(rank=rank)
        if not path.is_file():
            return False
        try:
            trainer = load_state(path, self.trainer.model.device)
        except Exception as exc:  # noqa: BLE001 — safetensors' and the layout's errors
            raise ValueError(f"{path}: the draft model's state cannot be read ({exc})") from exc
        if trainer.model.shape != self.trainer.model.shape:
            raise ValueError(f"{path}: a draft model of another shape "
                             f"({trainer.model.shape}) than this run's")
        self.trainer = trainer
        self.end_step()
        return True


__all__ = ["ModelSource", "ModelStats", "STATE_NAME"]
