"""The `floor` lane of `rhymectl bench drafter` (`--floor`): what one suffix-tree query per
live request and pass costs, with nothing else a drafter does.

Each prompt gets one tree over its prompt and its history (built as rhymectl's prompt trees
are, each history response after the prompt's last `max_depth` tokens); every pass asks
each row's prompt tree once, with the newest tokens a full-length draft needs
(`pipeline.drafting.suffix_tree.match_needed`) and the drafter's settings. No live
responses enter the trees, no draft is chained, no query is saved by a memo or worked out
ahead, no budget runs. So its time per pass is the least that any drafter asking the trees
for every row each pass pays on this machine, and its tau what such bare drafts from
history alone give: a reference for the other lanes, not a proposer.
"""

from __future__ import annotations

from pipeline.bench import drafter_workload as wl
from pipeline.bench.drafter import Side
from pipeline.bench.drafter_sim import InputBatch, Lane
from pipeline.bench.process_memory import measured_build
from pipeline.drafting.build import drafter_config
from pipeline.drafting.inputs import DrafterConfig
from pipeline.drafting.prompt_state import HistoryEntry, PromptState
from pipeline.drafting.suffix_tree import SuffixTree, match_needed


def floor_trees(work: wl.Workload, cfg: DrafterConfig) -> list[SuffixTree]:
    """One tree per prompt, laid out as the drafter's prompt trees are (`PromptState`: the
    prompt, then each history response after the prompt's tail), without live responses."""
    return [PromptState(str(p), prompt_ids=prompt.tolist(),
                        history=[HistoryEntry(ids, 1) for _, ids in hist]).build_tree(cfg.max_depth)
            for p, (prompt, hist) in enumerate(zip(work.prompts, work.history))]


def floor_proposer(trees: list[SuffixTree], work: wl.Workload, batch: InputBatch, k: int,
                   cfg: DrafterConfig):
    """propose(sampled) -> one bare draft per row, read from the batch as vLLM leaves it."""
    context = match_needed(k, cfg.max_spec_factor, cfg.max_spec_offset, cfg.max_depth) + 1
    args = (k, cfg.min_path_prob, cfg.max_spec_factor, cfg.max_spec_offset)
    tree_of = {f"{p}:{j}": trees[p] for p in range(len(trees)) for j in range(work.shape.group)}

    def propose(sampled):
        ids, ends, tokens = batch.req_ids, batch.num_tokens_no_spec, batch.token_ids_cpu
        return [tree_of[ids[i]].speculate(
                    tokens[i, max(0, int(ends[i]) - context):int(ends[i])].tolist(),
                    *args).token_ids
                for i in range(len(sampled))]

    return propose


def build_floor(work: wl.Workload, batch: InputBatch, k: int, max_model_len: int,
                start: int, spec=None) -> Side:
    """The floor lane on `work` (`pipeline.bench.drafter`'s builders' signature), its
    queries with the drafter's settings (`spec`, a SpecConfig; None: the defaults)."""
    cfg = DrafterConfig.for_method("history+group") if spec is None else drafter_config(spec)
    trees, build_s, growth = measured_build(lambda: floor_trees(work, cfg))
    lane = Lane("floor", work, batch, floor_proposer(trees, work, batch, k, cfg), start)
    return Side(lane, build_s, growth, trees.clear)


__all__ = ["build_floor", "floor_proposer", "floor_trees"]
