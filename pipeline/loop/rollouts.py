"""From prompts to trainable rollouts: generate groups, score them, pad them, record them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import torch

from pipeline.history.store import RolloutRecord, prompt_hash
from pipeline.rollout.contract import Completion, RolloutBackend, RolloutStats, Sampling
from pipeline.tasks.chat import PromptEncoder
from pipeline.tasks.prompts import Prompt
from pipeline.train import grpo
from pipeline.train.batch import Batch


@dataclass
class Rollout:
    """One response of one group, with everything the step needs downstream."""

    prompt: Prompt
    prompt_ids: list[int]
    sample_index: int
    completion: Completion
    text: str = ""
    reward: float = 0.0

    @property
    def length(self) -> int:
        return len(self.completion.token_ids)


def generate(engine: RolloutBackend, encoder: PromptEncoder, prompts: Sequence[Prompt],
             sampling: Sampling, keep: int | None = None,
             pinned: Sequence[bool] = ()) -> tuple[list[Rollout], RolloutStats]:
    """`sampling.n` responses per prompt, flattened group by group, and what the engine
    measured. With `keep` (tail batching), only the first `keep` groups to complete (the
    pinned ones among them)."""
    prompt_ids = encoder.encode_many([p.text for p in prompts])
    if keep is None:
        result = engine.generate(prompt_ids, sampling)
    else:
        result = engine.generate_first(prompt_ids, sampling, keep, pinned)
    out = []
    for prompt, ids, group in zip(prompts, prompt_ids, result.groups):
        for k, completion in enumerate(group or ()):
            text = encoder.decode(completion.token_ids)
            out.append(Rollout(prompt, ids, k, completion, text))
    return out, result.stats


def score(rollouts: list[Rollout], reward_fn: Callable[[str, str, str], float]) -> None:
    for r in rollouts:
        r.reward = float(reward_fn(r.prompt.text, r.text, r.prompt.answer))


def to_batch(rollouts: list[Rollout], pad_id: int, adv_estimator: str) -> Batch:
    """Right-padded [N, T] ids with group-normalised advantages (groups = prompt ids)."""
    seqs = [r.prompt_ids + r.completion.token_ids for r in rollouts]
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = torch.tensor(s)
    sampler = None  # vLLM's logprobs, on the steps that asked for them (all or none)
    if all(len(r.completion.logprobs) == len(r.completion.token_ids) for r in rollouts):
        sampler = torch.zeros((len(seqs), width - 1))
        for i, r in enumerate(rollouts):
            start = len(r.prompt_ids) - 1  # column j scores token j+1
            sampler[i, start: start + len(r.completion.logprobs)] = torch.tensor(r.completion.logprobs)
    estimator = grpo.get_advantage_estimator(adv_estimator)
    # Group key: a prompt may appear twice in one batch only as distinct groups.
    groups = [(r.prompt.id, id(r.prompt)) for r in rollouts]
    adv = estimator([r.reward for r in rollouts], groups)
    return Batch(ids, torch.tensor([len(r.prompt_ids) for r in rollouts]),
                 torch.tensor([len(s) for s in seqs]), adv.float(), sampler)


def to_records(rollouts: list[Rollout], epoch: int, step: int, version: int,
               epochs: Mapping[int, int] | None = None) -> list[RolloutRecord]:
    """epochs: id(prompt) -> the epoch it was drawn in, where that is not `epoch` (tail
    batching)."""
    epochs = epochs or {}
    return [RolloutRecord(
        prompt_id=r.prompt.id, prompt_hash=prompt_hash(r.prompt_ids),
        epoch=epochs.get(id(r.prompt), epoch), step=step,
        policy_version=version, sample_index=r.sample_index,
        response_ids=list(r.completion.token_ids), length=r.length,
        finish_reason=r.completion.finish_reason, reward=r.reward,
        gen_seconds=r.completion.gen_seconds) for r in rollouts]
