"""Which prompts each step trains on: a pure function of (seed, step), so a resumed run
sees exactly the batches an uninterrupted one would; and those the draft model warms up on."""

from __future__ import annotations

import random
from pipeline.errors import UsageError
from pipeline.tasks.prompts import Prompt, distinct, warmup_prompts


class PromptSource:
    """Epochs over a fixed prompt set: shuffled per epoch, last partial batch dropped."""

    def __init__(self, rows: list[dict], batch_size: int, seed: int, shuffle: bool = True):
        self.prompts = distinct(rows)  # a generated task may repeat a prompt; one copy per epoch
        if len(self.prompts) < batch_size:
            raise UsageError(f"the data set has {len(self.prompts)} distinct prompts, fewer than "
                             f"data.train_batch_size = {batch_size}; lower it or add data")
        self.batch_size = batch_size
        self.seed = seed
        self.shuffle = shuffle

    @property
    def steps_per_epoch(self) -> int:
        return len(self.prompts) // self.batch_size

    def epoch_of(self, step: int) -> int:
        return step // self.steps_per_epoch

    def order(self, epoch: int) -> list[int]:
        """The prompts' indices in the order `epoch` visits them."""
        order = list(range(len(self.prompts)))
        if self.shuffle:
            random.Random(self.seed * 1_000_003 + epoch).shuffle(order)
        return order

    def batch(self, step: int) -> list[Prompt]:
        """The global batch of `step` (0-based)."""
        epoch, index = divmod(step, self.steps_per_epoch)
        picked = self.order(epoch)[index * self.batch_size: (index + 1) * self.batch_size]
        return [self.prompts[i] for i in picked]


def even_share(prompts: list, world_size: int) -> list:
    """`prompts` cut to a multiple of `world_size`, so that every rank gets as many."""
    return prompts[:len(prompts) - len(prompts) % world_size]


def warmup_batch(cfg, world_size: int) -> list[Prompt]:
    """The prompts of the draft model's warm-up rollout (`spec.draft_warmup: rollout`,
    `pipeline.loop.warmup`) for `world_size` ranks, [] without one: as many for every rank
    (ZeRO-3's forward is collective: every rank scores as many rows). A number the data
    cannot give or the ranks cannot share is refused (UsageError), before the run
    directory is written."""
    n = cfg.spec.draft_warmup_prompts
    if cfg.spec.draft_warmup != "rollout":
        return []
    try:
        prompts = even_share(warmup_prompts(cfg.data, n), world_size)
    except ValueError as exc:
        raise UsageError(f"spec.draft_warmup_prompts = {n}: {exc}") from None
    if not prompts:
        raise UsageError(f"spec.draft_warmup_prompts = {n} is fewer than the {world_size} "
                         f"ranks, which share the warm-up evenly: ask for at least "
                         f"{world_size}, or use spec.draft_warmup=eval")
    return prompts


def shard(batch: list[Prompt], rank: int, world_size: int) -> list[Prompt]:
    """This rank's contiguous share (veRL's static split; smarter placement is `sched`)."""
    per_rank = len(batch) // world_size
    return batch[rank * per_rank: (rank + 1) * per_rank]
