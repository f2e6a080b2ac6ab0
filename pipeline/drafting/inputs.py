"""What the drafter is configured with and fed: `DrafterConfig` (which trees it draws on and
how far it drafts) and the earlier epochs' responses of a prompt (`HistoryResponse`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

from pipeline.config.methods import DRAFTER_METHODS, REGISTRY
from pipeline.config.schema import DRAFTER_SPEC_FACTOR

# `DrafterConfig.global_below`'s default: the global tree drafts where the prompt's trees
# expect less than one accepted token. Replayed on recorded runs (docs/speculation.md,
# "Trees"): their weak drafts lost to the global tree's shared phrasing on a real model's text.
GLOBAL_BELOW = 1.0


@dataclass(frozen=True)
class DrafterConfig:
    """What the drafter draws on and how far it drafts.

    max_depth: suffix-tree depth, tokens (vLLM's suffix default is 24);
    min_path_prob: cut a draft before its path probability falls below this;
    max_spec_factor / max_spec_offset: a draft is at most factor * match_len + offset
    tokens (short matches draft little; the factor's default is the schema's, as
    `spec.max_spec_factor` resolves it for the drafter's methods);
    reward_copies: with reward_weighted, the best response of a prompt counts
    1 + reward_copies times and the worst once (linear in between) — RhymeRL's
    reward-aware tree, realised as repeated sequences so the C++ counts carry the weight;
    max_global_responses / max_global_tokens: history kept in the global tree (FIFO, by
    responses and by tokens: memory follows tokens, some 250 bytes each);
    global_tokens_per_prompt: a prompt's newest history responses enter the global tree
    up to this many tokens (at short responses all of them; at 8k-token ones one, so a
    step's prompts do not push 8M tokens through a tree that keeps a quarter million);
    global_live: with siblings on, live responses also enter the global tree (drafts for
    other prompts' requests). Off by default: it doubles the tree work per live token and,
    measured with `rhymectl bench spec`, the cross-prompt format is already in the global
    tree through the history;
    global_below: the global tree is asked where the prompt's own trees' best draft scores
    below this (its expected accepted tokens under their counts) and the higher-scoring
    draft is kept, ties to the prompt's; 0: only where they offer nothing. Default
    GLOBAL_BELOW, where the prompt's trees expect less than one token; 0 for methods with
    a draft model, which drafts there (docs/speculation.md, "Trees");
    chain: a draft that stops before its cap is continued by asking the same tree again
    with the draft appended to the context (`pipeline.drafting.chain`): one query drafts at
    most max_depth - match_len tokens, which keeps drafts short where history repeats
    itself for longer; measured in docs/speculation.md ("Draft chains"). Every draft is
    chained while the pass is thin (running requests x (1 + cap) <= thin_pass_tokens:
    a GPU pass that costs about the same whatever it verifies); in a fuller pass, those
    of the `chain_longest` share of requests predicted to end last (the step's critical
    path) and of requests whose last draft was accepted whole. Chaining every draft of a
    full batch doubled the verified tokens and the drafter's time for 3 % more tokens
    per pass (docs/speculation.md, "Draft chains");
    own_tree: with siblings on, each request's own tree (its prompt and output alone) is
    fed and asked beside its prompt's: "thin" only in thin passes (as chains: where a GPU
    pass costs about the same whatever it verifies and few requests run, so it costs the
    drafter little), "always" in every pass, "never". In its prompt's tree a phrase the
    request keeps repeating is one sequence among its siblings' and history's and is cut
    at min_path_prob; its own tree counts it alone (docs/speculation.md, "Trees"). With
    siblings off the own tree is the request's only live tree and always used;
    background: work the next drafts need but the current ones do not (live tokens into
    the trees after a pass, ended groups out, trees built ahead) runs in a background
    thread (`pipeline.drafting.background`); False runs it inline, with the same drafts.
    """

    use_history: bool = True
    use_siblings: bool = True
    use_global: bool = True
    max_depth: int = 24
    min_path_prob: float = 0.1
    max_spec_factor: float = DRAFTER_SPEC_FACTOR
    max_spec_offset: float = 0.0
    reward_weighted: bool = False
    reward_copies: int = 2
    max_cached_prompts: int = 4096
    max_global_responses: int = 10000
    max_global_tokens: int = 1 << 18
    global_tokens_per_prompt: int = 1 << 13
    global_live: bool = False
    global_below: float = GLOBAL_BELOW
    chain: bool = True
    thin_pass_tokens: int = 296
    chain_longest: float = 0.25
    own_tree: str = "thin"
    background: bool = True

    @classmethod
    def for_method(cls, method: str, **kwargs) -> "DrafterConfig":
        """`history`, `group` or `history+group` (the registry's drafter methods); with
        a draft model beside the trees the global tree is a fallback only (global_below
        0: measured, its weak drafts displaced the model's where the prompt's trees
        offered little)."""
        m = REGISTRY.get(method)
        if m is None or not m.drafter:
            raise ValueError(f"no drafter for spec.method {method!r}; "
                             f"expected one of {sorted(DRAFTER_METHODS)}")
        kwargs.setdefault("global_below", 0.0 if m.model else GLOBAL_BELOW)
        return cls(use_history=m.history, use_siblings=m.siblings, **kwargs)



@dataclass(frozen=True)
class HistoryResponse:
    """One earlier response to a prompt, generated in `epoch`; reward is used only with
    reward_weighted."""

    token_ids: Sequence[int]
    reward: float | None = None
    epoch: int = 0



def reward_copies(responses: Sequence[HistoryResponse], cfg: DrafterConfig) -> list[int]:
    """How many times each history response enters the trees (1 unless reward-weighted)."""
    rewards = [r.reward for r in responses]
    if not cfg.reward_weighted or not rewards or any(r is None for r in rewards):
        return [1] * len(responses)
    lo, hi = min(rewards), max(rewards)
    if hi <= lo:
        return [1] * len(responses)
    return [1 + int(round(cfg.reward_copies * (r - lo) / (hi - lo))) for r in rewards]



def history_from_records(records: Iterable) -> dict[str, list[HistoryResponse]]:
    """Group history-store `RolloutRecord`s by prompt hash, as `set_history` takes them."""
    out: dict[str, list[HistoryResponse]] = {}
    for rec in records:
        out.setdefault(rec.prompt_hash, []).append(
            HistoryResponse(list(rec.response_ids), float(rec.reward), int(rec.epoch)))
    return out


__all__ = ["DrafterConfig", "HistoryResponse", "history_from_records", "reward_copies"]
