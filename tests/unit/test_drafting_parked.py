"""A step's responses reach the global tree although the loop freed their prompts first
(`Drafting.prepare` for the next step, then `remember`): prompts without history of their
own, as all are in a run's first epoch, draft from them."""

from __future__ import annotations

import pytest

from pipeline.bench.drafter_sim import InputBatch, simulated_runner
from pipeline.config.schema import SpecConfig
from pipeline.history.store import RolloutRecord, prompt_hash
from pipeline.rollout.speculation import Drafting

P, Q = [1, 2, 3, 4], [5, 6, 7, 8]
RESPONSE = list(range(40, 64))


def record(prompt, step, ids) -> RolloutRecord:
    return RolloutRecord("q", prompt_hash(prompt), 0, step, 0, 0, ids, len(ids), "stop", 0.0, 0.0)


def step_then_next(method: str) -> Drafting:
    """Step 0 generates Q, the loop prepares step 1 (P) and then remembers step 0."""
    spec = SpecConfig(method=method, num_speculative_tokens=8)
    d = Drafting(simulated_runner(spec, InputBatch(8, 64), 64), spec, background=False)
    d.before([Q], 2)
    d.after()
    d.prepare([P])
    d.remember([record(Q, 0, RESPONSE)])
    d.before([P], 2)
    return d


@pytest.mark.parametrize("method", ["history+group", "history"])
def test_a_freed_prompts_responses_draft_for_a_prompt_without_history(method):
    d = step_then_next(method)
    d.drafter.start("p", P, RESPONSE[:12])
    draft = d.drafter.draft("p", 8)
    assert draft.token_ids and draft.token_ids == RESPONSE[12:12 + len(draft.token_ids)]
    assert d.sources()["global"] == 1
    assert d.drafter.history_prompts() == 0  # Q is not held: only the global tree has it


def test_without_the_global_tree_nothing_is_kept():
    spec = SpecConfig(method="history+group", num_speculative_tokens=8)
    d = step_then_next("history+group")
    d.drafter.settle()
    assert d.drafter._table.global_tree.num_seqs == 1
    from dataclasses import replace

    from pipeline.drafting.build import drafter_config
    from pipeline.drafting.drafter import GroupDrafter

    plain = GroupDrafter(replace(drafter_config(spec), use_global=False, background=False))
    plain.park_history([prompt_hash(Q)], lambda keys: {})
    plain.settle()
    assert plain._table.prompts == {}
